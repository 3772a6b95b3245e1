"""The GPU mode's pieces that run without a GPU: the race-side probe's parsing and location
matching, the why it computes, the forcing's device-op test, and the rows kept from a dead
child's trial journal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from overlap_harness.engines.sglang.gpu import table as gpu_table
from overlap_harness.engines.sglang.gpu.loop import _on_device
from overlap_harness.engines.sglang.gpu.probe import _key, _matches, probes, why_equal

EXAMPLES = [
    "RAW add: target_prefill_forward on self.forward_stream at /x/overlap_harness/engines/"
    "sglang/eagle_worker.py:216 / copy_ on self.copy_stream at sglang/srt/utils/common.py:615",
    "RAW predict@eagle_utils.py:632: zeros on self.forward_stream at sglang/srt/speculative/"
    "eagle_utils.py:632 / copy_ on self.copy_stream at sglang/srt/utils/common.py:615",
    "host-D2H host@common.py:614: copy_ on self.copy_stream at sglang/srt/utils/common.py:615"
    " / tolist on host at sglang/srt/managers/b.py:293",
]


def test_probe_takes_the_sides_of_the_races_whose_earlier_side_is_the_stream() -> None:
    forward = probes(EXAMPLES, "forward_stream")
    assert forward.earlier == ("/x/overlap_harness/engines/sglang/eagle_worker.py:216",
                               "sglang/srt/speculative/eagle_utils.py:632")
    assert forward.later == ("sglang/srt/utils/common.py:615",)
    copy = probes(EXAMPLES, "copy_stream")
    assert copy.earlier == ("sglang/srt/utils/common.py:615",)
    assert copy.later == ("sglang/srt/managers/b.py:293",)
    assert probes(EXAMPLES, "plan_stream").earlier == ()
    # a checkout's prefix is dropped: the harness's and SGLang's paths match anywhere
    assert _key("/x/overlap_harness/engines/sglang/w.py:3") == ("overlap_harness/engines/"
                                                               "sglang/w.py", 3)
    assert _key("/tmp/sg/sglang/srt/a.py:9") == ("sglang/srt/a.py", 9)


def test_a_frame_matches_any_line_of_the_call_it_runs() -> None:
    path = "tests/engines/test_sglang_gpu_probe.py"
    lines: list[int] = []
    matched: list[int] = []

    def inner() -> int:
        caller = sys._getframe(2)  # this test, inside the max(...) call below
        lines.append(caller.f_lineno)
        matched.extend(n for n in range(caller.f_lineno - 3, caller.f_lineno + 4)
                       if _matches(caller, [(path, n)]))
        return 0

    max(
        [1],
        key=lambda _: inner(),
    )
    assert len(matched) == 4  # the call's four lines, whichever the frame reports
    assert lines[0] in matched
    assert not _matches(sys._getframe(), [("tests/engines/other.py", lines[0])])


def test_why_equal_tells_a_made_race_from_one_the_delay_cannot_make() -> None:
    probe = {"stream": "copy_stream", "earlier": ["a.py:1"], "later": ["b.py:2"]}
    key, text = why_equal({"earlier_issued": 3, "later_pending": 2, "later_done": 1,
                           "later_first": 0}, probe)
    assert key == "overwritten" and "2 of 3" in text
    key, text = why_equal({"earlier_issued": 3, "later_pending": 0, "later_done": 4,
                           "later_first": 0}, probe)
    assert key == "timing" and "finished each of the 4 times" in text
    key, text = why_equal({"earlier_issued": 0, "later_pending": 0, "later_done": 0,
                           "later_first": 5}, probe)
    assert key == "timing" and "nothing to hold" in text


def test_a_host_to_device_copy_is_a_device_op() -> None:
    host = torch.zeros(2)
    assert _on_device((host,), {"device": torch.device("cuda"), "non_blocking": True})
    assert not _on_device((host,), {"dtype": torch.float64})


def test_abort_reason_is_the_what_line() -> None:
    err = ("frame #3\nterminate called after throwing an instance of 'c10::Error'\n"
           "  what():  CUDA error: device-side assert triggered\nframe #30: _start + 0x25\n")
    assert gpu_table.abort_reason(err) == "what():  CUDA error: device-side assert triggered"
    assert gpu_table.abort_reason("a\nlast line\n") == "last line"
    assert gpu_table.abort_reason("") == "no output"


def test_a_dead_childs_rows_keep_their_finished_trials(tmp_path: Path) -> None:
    rows = [{"variant": v, "site": "s.py:1", "code": "x", "cpu_verdict": "race",
             "delay": ["copy_stream"]} for v in ("a", "b", "c")]
    trial = {"forcing": "copy_stream+1cy", "wrong": "r1.output_ids[0] = 1 (serial 2)",
             "error": None, "seconds": 0.1, "sleeps": 3, "probe": None}
    journal = tmp_path / "journal0.jsonl"
    journal.write_text("\n".join(json.dumps(e) for e in [
        {"row": 0, "starting": "copy_stream+1cy"}, {"row": 0, "trial": trial},
        {"row": 1, "starting": "copy_stream+1cy"}]) + "\n")
    done = gpu_table.from_journal(rows, journal, "exit -6: CUDA error")
    assert done[0]["trials"] == 1 and done[0]["wrong_trials"] == 1
    assert done[0]["aborted"] == "exit -6: CUDA error"
    assert done[1]["trials"] == 1 and done[1]["crashed_trials"] == 1
    assert "CUDA error" in done[1]["example_crash"]
    assert done[2]["trials"] == 0 and done[2]["error"] == "exit -6: CUDA error"
    stopped = gpu_table.from_journal(rows, journal, "stopped", died_in_trial=False)
    assert stopped[1]["trials"] == 0 and stopped[1]["error"] == "stopped"


def test_each_child_takes_a_few_rows_of_one_site_the_heaviest_first() -> None:
    def row(variant: str) -> dict:
        return {"variant": variant}

    by_site = {"a.py:1": [row(f"non_{i}") for i in range(7)],
               "b.py:2": [row("eagle_topk1"), row("eagle_mixed")], None: [row("non_0")]}
    work = gpu_table.pieces(by_site)
    assert [(site, len(rows)) for site, rows in work] == [
        ("b.py:2", 2), ("a.py:1", 5), ("a.py:1", 2), (None, 1)]
    assert sum(len(rows) for _, rows in work) == 10


def test_resume_keeps_the_settled_rows_and_plans_only_the_others(tmp_path: Path) -> None:
    from overlap_harness.engines.sglang.gpu.command import _resumed

    loop = {"variants": ["a"], "rows": [
        {"variant": "a", "site": f"s.py:{n}", "code": "x", "real": verdict,
         "race_examples": []} for n, verdict in ((1, "race"), (2, "race"), (3, "race_free"),
                                                 (4, "race_free"))]}
    made = {"earlier_issued": 1, "later_pending": 1, "later_done": 0, "later_first": 0}

    def trial(forcing: str, sleeps: int, **more: object) -> dict:
        return {"forcing": forcing, "wrong": None, "error": None, "seconds": 0.1,
                "sleeps": sleeps, "probe": None, **more}

    def row(site: str | None, verdict: str | None, trials: list[dict]) -> dict:
        return {"variant": "a", "site": site, "code": "x", "cpu_verdict": verdict,
                "trials": len(trials), "wrong_trials": sum(bool(t["wrong"]) for t in trials),
                "trial_details": trials, "probes": [{"stream": "copy_stream", "earlier": [],
                                                     "later": []}] if verdict == "race" else []}

    control = [trial(f"copy_stream+{c}cy", 2) for c in gpu_table.CONTROL_CYCLES]
    earlier = {"sglang_version": "0.5.23", "device": "NVIDIA H200", "command": "c",
               "date": "d", "seconds": 1.0, "child_failures": [], "torch": "2.11", "rows": [
                   # made and wrong: settled
                   row("s.py:1", "race", [trial("copy_stream@earlier+2097152cy", 1,
                                                probe=made, wrong="r = 1 (serial 2)")]),
                   # wrong, but no probe saw the race made (an old report's row): again
                   row("s.py:2", "race", [trial("copy_stream+1048576cy", 1,
                                                wrong="r = 1 (serial 2)")]),
                   row("s.py:3", "race_free", [trial("copy_stream+2097152cy", 3)]),
                   # held nothing: not evidence, again
                   row("s.py:4", "race_free", [trial("copy_stream+2097152cy", 0)]),
                   # the unmodified loop held at one delay only: again
                   row(None, None, control[:1])]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept, document = _resumed(path, "0.5.23")
    assert [r["site"] for r in kept] == ["s.py:1", "s.py:3"] and document["command"] == "c"
    assert kept[0]["race_made_trials"] == 1 and kept[1]["slept_trials"] == 1
    assert {r["device"] for r in kept} == {"NVIDIA H200"}  # each row keeps where it ran
    skip = frozenset((r["variant"], r["site"]) for r in kept)
    planned = gpu_table.plan(loop, None, skip)
    assert list(planned) == [None, "s.py:2", "s.py:4"]
    assert gpu_table.settled(gpu_table.recounted(row(None, None, control)))
    refused, _ = _resumed(path, "0.5.22")
    assert isinstance(refused, str) and "0.5.23" in refused


def test_rerun_unrun_keeps_every_row_whose_trials_ran(tmp_path: Path) -> None:
    """``--gpu-rerun unrun``: rows with trials stay (settled or not); the deadline's rows and
    a failed child's run again."""
    from overlap_harness.engines.sglang.gpu.command import _resumed

    ran = {"variant": "a", "site": "s.py:1", "code": "x", "cpu_verdict": "race", "trials": 1,
           "wrong_trials": 0, "trial_details": [
               {"forcing": "copy_stream@earlier+2097152cy", "wrong": None, "error": None,
                "seconds": 0.1, "sleeps": 1, "probe": None}], "probes": []}
    deadline = {"variant": "a", "site": "s.py:2", "code": "x", "cpu_verdict": "race",
                "trials": 0, "error": "not run: the run's deadline"}
    earlier = {"sglang_version": "0.5.23", "device": "d", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "t", "rows": [ran, deadline]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    assert [r["site"] for r in _resumed(path, "0.5.23", "unrun")[0]] == ["s.py:1"]
    assert _resumed(path, "0.5.23")[0] == []  # unsettled: made no race, runs again


def test_reports_name_no_machine_path() -> None:
    """A crash's frames and an older run's command keep no machine's prefix."""
    from overlap_harness.engines.sglang.gpu.command import without_local_paths
    from overlap_harness.engines.sglang.gpu.probe import without_machine_paths

    crash = ("IndexError: list index out of range at /tmp/sg/sglang/srt/managers/"
             "schedule_batch.py:1572 in f; wait at /opt/v/lib/python3.12/site-packages/torch/"
             "cuda/streams.py:63; at /home/u/repo/overlap_harness/engines/x.py:4")
    assert without_machine_paths(crash) == (
        "IndexError: list index out of range at sglang/srt/managers/schedule_batch.py:1572 "
        "in f; wait at torch/cuda/streams.py:63; at overlap_harness/engines/x.py:4")
    command = "overlap-harness sglang --gpu-report /root/out --gpu-resume /w/m/.gpu/h/prev.json"
    assert without_local_paths(command) == (
        "overlap-harness sglang --gpu-report <out> --gpu-resume <prev.json>")
