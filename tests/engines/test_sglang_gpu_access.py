"""The GPU table's access oracle without a GPU: which lines it watches, how a difference at a
race's own access is told, and how a row whose outputs stayed equal says so."""

from __future__ import annotations

from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu.access_values import (
    first_access_difference,
    side_locations,
    unstable_accesses,
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


def test_ops_that_differ_between_two_serial_runs_are_not_compared() -> None:
    sides = side_locations(EXAMPLES)
    first = {sides[0]: [[140041626063360]], sides[1]: [[5, 6], [7, 8]], sides[2]: [[1]]}
    second = {sides[0]: [[140041598800384]], sides[1]: [[5, 6], [7, 8]], sides[2]: [[1], [1]]}
    unstable = unstable_accesses(first, second)
    assert unstable == [[sides[0], 0], [sides[2], None]]  # an address; a line's count
    forced = {sides[0]: [[1]], sides[1]: [[5, 6], [7, 8]], sides[2]: [[9], [9], [9]]}
    assert first_access_difference(forced, first, sides, unstable) is None
    forced[sides[1]] = [[5, 6], [5, 6]]  # a stable op that differs is still told
    assert first_access_difference(forced, first, sides, unstable) == (
        "sglang/srt/managers/overlap_utils.py:638, its op 2: [5, 6] (serial [7, 8])")


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


def _loop_with_released() -> dict:
    example = ("WAR b@x.py:1: copy_ on self.forward_stream at sglang/srt/a.py:3 / "
               "index_put_ on self.schedule_stream at sglang/srt/b.py:4")
    return {"sglang_version": "0.5.23", "variants": ["d", "e"], "released_races": {
        "d": [example]}, "rows": [
        {"variant": v, "site": "sglang/srt/c.py:9", "code": "w()", "real": "race_free",
         "race_examples": []} for v in ("d", "e")]}


def test_every_row_of_a_variant_that_races_as_released_says_so() -> None:
    """Its redundant rows too: a delay there may make the released race, so their wrong
    values are counted apart, and they do not fail the run."""
    from overlap_harness.engines.sglang.gpu import table as gpu_table

    planned = gpu_table.planned_verdicts(_loop_with_released())
    assert planned == {("d", None): ("race", True), ("e", None): (None, False),
                       ("d", "sglang/srt/c.py:9"): ("race_free", True),
                       ("e", "sglang/srt/c.py:9"): ("race_free", False)}
    wrong = {"cpu_verdict": "race_free", "site": "sglang/srt/c.py:9", "code": "w()",
             "trials": 1, "wrong_trials": 1, "example_wrong": "r1.output_ids: 1 values",
             "slept_trials": 1, "race_made_trials": 0, "forced_delay": ["s+1cy"],
             "trial_details": [{"forcing": "s+1cy", "sleeps": 1}], "repro": "r"}
    rows = [dict(wrong, variant="d", races_as_released=True), dict(wrong, variant="e")]
    summary = gpu_report.document(rows, version="0.5.23", device="d", torch_version="t",
                                  date="d", command="c", failures=[], seconds=1.0)["summary"]
    assert summary["race_free_rows_wrong"] == 1
    assert summary["race_free_rows_wrong_released"] == 1


def test_a_resumed_row_planned_under_another_verdict_runs_again(tmp_path) -> None:
    """``--gpu-resume``: the unmodified row of ``d`` ran as a control (cpu_verdict None)
    before the loop report listed its released races: it is not kept; ``e``'s is."""
    import json

    from overlap_harness.engines.sglang.gpu import table as gpu_table
    from overlap_harness.engines.sglang.gpu.command import _resumed

    control = {"site": None, "code": None, "cpu_verdict": None, "trials": 1,
               "wrong_trials": 0, "example_wrong": None, "slept_trials": 1,
               "race_made_trials": 0, "forced_delay": ["forward_stream+2097152cy"],
               "trial_details": [{"forcing": f"forward_stream+{c}cy", "sleeps": 1,
                                  "acceptance_wrong": None}
                                 for c in gpu_table.CONTROL_CYCLES]}
    control["trials"] = len(control["trial_details"])
    control["forced_delay"] = [t["forcing"] for t in control["trial_details"]]
    earlier = {"sglang_version": "0.5.23", "device": "x", "torch": "t", "rows": [
        dict(control, variant="d"), dict(control, variant="e")]}
    path = tmp_path / "prev.json"
    path.write_text(json.dumps(earlier))
    planned = gpu_table.planned_verdicts(_loop_with_released())
    kept, _ = _resumed(path, "0.5.23", "unrun", planned)
    assert [r["variant"] for r in kept] == ["e"]
    kept, _ = _resumed(path, "0.5.23", "unrun")  # without a plan: as before
    assert [r["variant"] for r in kept] == ["d", "e"]
    # a control whose trials predate the acceptance record runs again (no control of it)
    older = dict(control, variant="f", trial_details=[
        {k: v for k, v in t.items() if k != "acceptance_wrong"}
        for t in control["trial_details"]])
    path.write_text(json.dumps(dict(earlier, rows=[*earlier["rows"], older])))
    assert [r["variant"] for r in _resumed(path, "0.5.23", "unrun")[0]] == ["d", "e"]


def test_a_d2h_copys_pinned_destination_is_snapshotted_back_on_the_device(
        monkeypatch) -> None:
    """A device op's host output (a relay's or a result's D2H copy into pinned memory) is
    kept too: copied back to the device, stream-ordered, never read on the host."""
    import torch

    from overlap_harness.engines.sglang.gpu.access_values import AccessCapture

    moved: list[tuple[str, bool]] = []

    def to_device(tensor, device, non_blocking=False):
        moved.append((device, non_blocking))
        return tensor.clone()

    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda tensor: True)
    monkeypatch.setattr(torch.Tensor, "to", to_device)
    capture = AccessCapture(["sglang/srt/managers/overlap_utils.py:243"])
    host = torch.tensor([0.5, 0.25])
    capture.capture("sglang/srt/managers/overlap_utils.py:243", host)
    host.fill_(0.0)  # what the host does with it afterwards is not in the snapshot
    assert moved == [("cuda", True)]
    assert capture._snapshots["sglang/srt/managers/overlap_utils.py:243"][0].tolist() == [
        0.5, 0.25]
    # an unpinned host tensor (no device op wrote it) is not kept
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda tensor: False)
    capture.capture("sglang/srt/managers/overlap_utils.py:243", torch.tensor([1.0]))
    assert len(capture._snapshots["sglang/srt/managers/overlap_utils.py:243"]) == 1


def test_the_allocator_cache_is_dirtied_with_a_pattern_of_every_block_size(monkeypatch) -> None:
    """Between the two serial runs: blocks of the small pool's sizes and a few large ones,
    filled with the pattern and freed, so that an element no op writes differs the second
    time."""
    import torch

    from overlap_harness.engines.sglang.gpu import access_values

    filled: list[tuple[int, int]] = []
    real_full = torch.full

    def recording_full(size, value, **kwargs):
        filled.append((size[0], value))
        return real_full(size, value, **{**kwargs, "device": "cpu"})

    monkeypatch.setattr(torch, "full", recording_full)
    total = access_values.dirty_allocator_cache("cuda")
    sizes = {size for size, _ in filled}
    assert {512, 1 << 20, 32 << 20} <= sizes
    assert {value for _, value in filled} == {access_values.DIRTY_BYTE}
    assert total == sum(size for size, _ in filled)
    assert len(filled) == len(access_values.DIRTY_BLOCK_BYTES) * \
        access_values.DIRTY_BLOCKS_PER_SIZE
