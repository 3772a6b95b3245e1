"""The GPU table's access oracle without a GPU: which lines it watches, how a difference at a
race's own access is told, and how a row whose outputs stayed equal says so."""

from __future__ import annotations

from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu.access_values import (
    first_access_difference,
    side_locations,
)

EXAMPLES = [
    "RAW self.buf@overlap_utils.py:320 (iteration 1): index_put_ on self.forward_stream at "
    "sglang/srt/managers/overlap_utils.py:662 / copy_ on self.fwd_prepare_d2h_stream at "
    "sglang/srt/managers/overlap_utils.py:638",
    "RAW self.buf@overlap_utils.py:320 (iteration 2): index_put_ on self.forward_stream at "
    "sglang/srt/managers/overlap_utils.py:662 / copy_ on host at sglang/srt/x.py:9",
]


def test_both_sides_of_every_example_are_watched_once() -> None:
    assert side_locations(EXAMPLES) == ("sglang/srt/managers/overlap_utils.py:662",
                                        "sglang/srt/managers/overlap_utils.py:638",
                                        "sglang/srt/x.py:9")


def test_the_first_differing_value_at_a_side_is_named_with_its_op() -> None:
    sides = side_locations(EXAMPLES)
    serial = {sides[0]: [[5, 6]], sides[1]: [[5, 6], [7, 8]]}
    assert first_access_difference(serial, serial, sides) is None
    stale = {sides[0]: [[5, 6]], sides[1]: [[5, 6], [5, 6]]}
    assert first_access_difference(stale, serial, sides) == (
        "sglang/srt/managers/overlap_utils.py:638, its op 2: [5, 6] (serial [7, 8])")
    fewer = {sides[0]: [[5, 6]], sides[1]: [[5, 6]]}
    assert first_access_difference(fewer, serial, sides) == (
        "sglang/srt/managers/overlap_utils.py:638: 1 ops (serial 2)")
    # a line not asked about is not compared
    assert first_access_difference(stale, serial, sides[:1]) is None


def test_a_made_race_wrong_at_its_access_says_so_and_counts() -> None:
    """A necessary row whose outputs equal the serial answer, but whose race-made trial left
    a different value at the race's access: ``wrong_at_access``, computed from the trials."""
    made = {"earlier_issued": 1, "later_pending": 1, "later_done": 0, "later_first": 0}
    row = {"variant": "v", "site": "s.py:1", "code": "x", "cpu_verdict": "race", "trials": 2,
           "wrong_trials": 0, "crashed_trials": 0, "made_crashed_trials": 0,
           "made_access_wrong_trials": 1, "access_wrong_unmade_trials": 1,
           "example_access_wrong": "forward_stream@earlier+2097152cy: a.py:1, its op 1: [1] "
                                   "(serial [2])",
           "forced_delay": ["forward_stream@earlier+2097152cy"] * 2,
           "slept_trials": 2, "race_made_trials": 1, "example_wrong": None,
           "trial_details": [{"forcing": "forward_stream@earlier+2097152cy", "sleeps": 1,
                              "probe": made}, {"forcing": "forward_stream@earlier+2097152cy",
                                               "sleeps": 1, "probe": None}],
           "probes": [{"stream": "forward_stream", "earlier": [], "later": []}]}
    document = gpu_report.document([row], version="0.5.23", device="d", torch_version="t",
                                   date="d", command="c", failures=[], seconds=1.0)
    (out,) = document["rows"]
    assert out["why_reason"] == "wrong_at_access" and "its op 1: [1] (serial [2])" in out["why"]
    assert document["summary"]["race_rows_why_wrong_at_access"] == 1
    assert document["summary"]["access_wrong_unmade_trials"] == 1
    # the same row without the access difference is what it was: overwritten
    row.update(made_access_wrong_trials=0, example_access_wrong=None)
    again = gpu_report.document([row], version="0.5.23", device="d", torch_version="t",
                                date="d", command="c", failures=[], seconds=1.0)
    assert again["rows"][0]["why_reason"] == "overwritten"


def test_a_variant_that_races_as_released_is_forced_on_its_unmodified_loop() -> None:
    """The loop report's ``released_races`` (the unmodified loop's races, from the necessity
    document) make that variant's unmodified row a race row, forced from its earlier sides;
    a variant without them keeps the control row; the report's check holds both."""
    from overlap_harness.engines.sglang.gpu import table as gpu_table
    from overlap_harness.engines.sglang.report.loop_report import released_races

    race = {"kind": "WAR", "tensor": "confidence_buf@overlap_utils.py:90", "variant": "d",
            "iteration": 2,
            "first": {"file": "/t/sglang/srt/managers/overlap_utils.py", "line": 243,
                      "op": "copy_", "stream": "self.fwd_prepare_d2h_stream"},
            "second": {"file": "/t/sglang/srt/managers/overlap_utils.py", "line": 235,
                       "op": "index_put_", "stream": "self.forward_stream"}}
    released = released_races([race, dict(race, iteration=3)])
    assert released == {"d": [
        "WAR confidence_buf@overlap_utils.py:90: copy_ on self.fwd_prepare_d2h_stream at "
        "sglang/srt/managers/overlap_utils.py:243 / index_put_ on self.forward_stream at "
        "sglang/srt/managers/overlap_utils.py:235"]}
    loop = {"sglang_version": "0.5.23", "variants": ["d", "e"], "rows": [],
            "released_races": released}
    unmodified = {r["variant"]: r for r in gpu_table.plan(loop)[None]}
    assert unmodified["d"]["cpu_verdict"] == "race"
    assert unmodified["d"]["delay"] == ["fwd_prepare_d2h_stream"]
    assert unmodified["e"]["cpu_verdict"] is None and unmodified["e"]["delay"] == []
    rows = [{"variant": "d", "site": None, "code": None, "cpu_verdict": "race", "trials": 0,
             "wrong_trials": 0, "example_wrong": None, "why": "w", "why_reason": "not_run"},
            {"variant": "e", "site": None, "code": None, "cpu_verdict": "race", "trials": 0,
             "wrong_trials": 0, "example_wrong": None, "why": "w", "why_reason": "not_run"}]
    found = gpu_report.problems({"sglang_version": "0.5.23", "rows": rows}, loop)
    assert found == ["e None: the unmodified loop's cpu_verdict race but the loop report "
                     "lists 0 released races"]
