"""The GPU table's forcing from the race itself, run without a GPU: a race row's delay grows
until a trial shows a wrong value, falls back to the whole stream where the earlier side held
nothing; each row counts the trials that held work back and made the race; a redundant row
whose trials held nothing is not evidence; a wrong row names its repro command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlap_harness.engines.sglang.gpu import loop as gpu_loop
from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu import table as gpu_table
from overlap_harness.engines.sglang.gpu.command import parse_forcing, relative_command
from overlap_harness.engines.sglang.gpu.loop import Forcing, Trial
from overlap_harness.engines.sglang.gpu.probe import probes

EXAMPLE = ("WAR x@a.py:1: model_forward on self.forward_stream at /m/overlap_harness/engines/"
           "sglang/worker.py:158 / write on self.schedule_stream at sglang/srt/alloc.py:452")
FIXED_LABEL = "forward_stream@earlier+2097152cy"
RACE_ROW = {"variant": "v", "site": "sglang/srt/s.py:9", "code": "wait()",
            "cpu_verdict": "race", "delay": ["forward_stream"], "race_examples": [EXAMPLE]}


def _scripted(monkeypatch: pytest.MonkeyPatch, outcomes: list[dict]) -> list[Forcing]:
    """run_trial replaced: each call takes the next outcome (Trial fields); the forcings
    asked for are returned in order."""
    asked: list[Forcing] = []

    def fake(variant: str, forcing: Forcing, serial: dict, probe: object = None,
             access_locations: tuple = ()) -> tuple:
        asked.append(forcing)
        # each trial keeps the values of both race sides' ops (access_values)
        assert set(access_locations) == {"/m/overlap_harness/engines/sglang/worker.py:158",
                                         "sglang/srt/alloc.py:452"}
        return Trial(forcing.label(), **outcomes[len(asked) - 1]), {}, []

    monkeypatch.setattr(gpu_loop, "run_trial", fake)
    monkeypatch.setattr(gpu_table, "_journal", lambda entry: None)
    return asked


def test_the_delay_grows_until_a_trial_is_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    made = {"earlier_issued": 2, "later_pending": 1, "later_done": 0, "later_first": 0}
    asked = _scripted(monkeypatch, [{"sleeps": 2, "probe": made},
                                    {"sleeps": 2, "probe": made, "wrong": "r1 = 3 (serial 4)"}])
    trials = gpu_table._race_trials(0, RACE_ROW, {})
    assert [f.cycles for f in asked] == list(gpu_table.RACE_CYCLES[:2])
    assert all(f.targeted and f.streams == ("forward_stream",) for f in asked)
    row = gpu_table._row(RACE_ROW, trials, None)
    assert (row["slept_trials"], row["race_made_trials"], row["made_wrong_trials"]) == (2, 2, 1)
    assert row["repro"] == ("overlap-harness sglang --gpu --repro v sglang/srt/s.py:9 "
                            "--repro-forcing forward_stream@earlier+8388608cy")
    assert row["probes"][0]["earlier"] == ["/m/overlap_harness/engines/sglang/worker.py:158"]


def test_an_earlier_side_that_holds_nothing_falls_back_to_the_whole_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _scripted(monkeypatch, [{"sleeps": 0}, {"sleeps": 5}, {"sleeps": 5}, {"sleeps": 5}])
    trials = gpu_table._race_trials(0, RACE_ROW, {})
    assert [(f.targeted, f.cycles) for f in asked] == [
        (True, 1 << 21), (False, 1 << 21), (False, 1 << 23), (False, 1 << 25)]
    row = gpu_table._row(RACE_ROW, trials, None)
    assert row["slept_trials"] == 3 and row["race_made_trials"] == 0 and "repro" not in row
    # a stream that issued nothing at all: no escalation (nothing to hold at any delay)
    asked = _scripted(monkeypatch, [{"sleeps": 0}, {"sleeps": 0}])
    assert len(gpu_table._race_trials(0, RACE_ROW, {})) == 2 and len(asked) == 2


def test_a_redundant_row_that_held_nothing_is_not_exercised() -> None:
    row = {"variant": "v", "site": "s.py:1", "code": "x", "cpu_verdict": "race_free",
           "delay": []}
    idle = gpu_table._row(row, [Trial("copy_stream+2097152cy", sleeps=0)], None)
    assert idle["not_exercised"] is True and idle["slept_trials"] == 0
    held = gpu_table._row(row, [Trial("copy_stream+2097152cy", sleeps=3),
                                Trial("plan_stream+2097152cy", sleeps=0)], None)
    assert held["not_exercised"] is False and held["slept_trials"] == 1
    rows = [dict(idle, site="a"), dict(held, site="b")]
    counts = gpu_report.summary(rows)
    assert counts["race_free_rows_all_equal"] == 1
    assert counts["race_free_rows_not_exercised"] == 1


def test_the_unmodified_loop_runs_at_every_delay_the_rows_use() -> None:
    forcings = gpu_table._forcings_of({"site": None}, ["copy_stream", "forward_stream"])
    assert forcings[0] == Forcing()
    used = set(gpu_table.RACE_CYCLES) | set(gpu_table.SWEEP_CYCLES)
    for stream in ("copy_stream", "forward_stream"):
        assert {f.cycles for f in forcings if f.streams == (stream,)} == used


def test_a_crash_is_evidence_only_where_the_race_was_made() -> None:
    made = {"earlier_issued": 1, "later_pending": 1, "later_done": 0, "later_first": 0}
    unmade = {"earlier_issued": 1, "later_pending": 0, "later_done": 3, "later_first": 0}
    crash_made = gpu_table._row(RACE_ROW, [Trial("forward_stream@earlier+2097152cy",
                                                 error="boom", sleeps=1, probe=made)], None)
    crash_unmade = gpu_table._row(RACE_ROW, [Trial("forward_stream@earlier+2097152cy",
                                                   error="boom", sleeps=1, probe=unmade)], None)
    report = gpu_report.document([crash_made, dict(crash_unmade, site="other.py:2")],
                                 version="0", device="d", torch_version="t", date="x",
                                 command="c", failures=[], seconds=0)
    by_site = {r["site"]: r for r in report["rows"]}
    assert by_site["sglang/srt/s.py:9"]["why_reason"] == "crashed"
    assert by_site["other.py:2"]["why_reason"] == "timing"
    assert "crashed without the probe seeing the race made" in by_site["other.py:2"]["why"]
    assert report["summary"]["race_rows_wrong_or_made_crash"] == 1


def test_a_dead_childs_trial_made_the_race_if_its_journal_says_so(tmp_path: Path) -> None:
    journal = tmp_path / "journal0.jsonl"
    journal.write_text("\n".join(json.dumps(e) for e in [
        {"row": 0, "starting": "forward_stream@earlier+2097152cy"},
        {"row": 0, "made": "forward_stream@earlier+2097152cy"},
        {"row": 1, "starting": "forward_stream@earlier+2097152cy"}]) + "\n")
    rows = [RACE_ROW, dict(RACE_ROW, variant="w")]
    done = gpu_table.from_journal(rows, journal, "exit -6: CUDA error")
    assert done[0]["race_made_trials"] == 1 and done[0]["made_crashed_trials"] == 1
    assert done[1]["race_made_trials"] == 0 and done[1]["crashed_trials"] == 1


def test_report_problems_recount_slept_and_made_trials() -> None:
    row = gpu_table._row(RACE_ROW, [Trial("f@earlier+1cy", sleeps=1, wrong="x (serial y)")],
                         None)
    loop = {"sglang_version": "0", "rows": [{"variant": "v", "site": RACE_ROW["site"],
                                             "real": "race"}]}
    report = gpu_report.document([row], version="0", device="d", torch_version="t",
                                 date="x", command="c", failures=[], seconds=0)
    assert gpu_report.problems(report, loop) == []
    report["rows"][0]["slept_trials"] = 0
    report["rows"][0].pop("repro")
    found = gpu_report.problems(report, loop)
    assert any("slept/made 0/0" in p for p in found)
    assert any("without a repro" in p for p in found)


def test_a_forcing_label_parses_back_and_paths_in_the_command_are_relative(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_forcing("plan_stream@earlier+8388608cy") == ("plan_stream", True, 8388608)
    assert parse_forcing("copy_stream+2097152cy") == ("copy_stream", False, 2097152)
    with pytest.raises(ValueError, match="STREAM"):
        parse_forcing("plan_stream")
    inside = tmp_path / "reports"
    inside.mkdir()
    outside = tmp_path.parent / "elsewhere.json"
    outside.write_text("{}")
    monkeypatch.chdir(tmp_path)
    command = relative_command(["sglang", "--gpu", "--gpu-report", str(inside),
                                "--gpu-resume", str(outside)])
    assert command == ("overlap-harness sglang --gpu --gpu-report reports --gpu-resume "
                       "'<elsewhere.json>'")
    outside.unlink()


def test_a_host_earlier_side_is_held_on_the_host() -> None:
    example = ("WAW x: index_put_ on host at sglang/srt/a.py:3 / copy_ on self.copy_stream "
               "at sglang/srt/b.py:4")
    assert gpu_table.earlier_streams([example]) == ["host"]
    probe = probes([example], "host")
    assert probe.earlier == ("sglang/srt/a.py:3",) and probe.later == ("sglang/srt/b.py:4",)


class _FakeProbe:
    """Says whether the op being issued comes from the earlier side; counts what it is told."""

    def __init__(self, earlier: bool) -> None:
        self.earlier = earlier
        self.told: list[bool] = []

    def at_earlier(self, depth: int) -> bool:
        return self.earlier

    def after_op(self, at_earlier: bool) -> None:
        self.told.append(at_earlier)


@pytest.mark.parametrize(("current", "earlier", "targeted", "held"), [
    (7, True, True, True),     # the earlier side's op on the delayed stream
    (7, False, True, False),   # another op of that stream: not held when targeted
    (7, False, False, True),   # ... held when the whole stream is delayed
    (9, True, True, True),     # the earlier side's op on a stream object the loop does not hold
    (9, True, False, False),   # whole-stream forcing holds only the named stream
])
def test_the_targeted_forcing_holds_exactly_the_earlier_sides_ops(
        monkeypatch: pytest.MonkeyPatch, current: int, earlier: bool, targeted: bool,
        held: bool) -> None:
    import torch

    slept: list[int] = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda: type("S", (), {"cuda_stream": current})())
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    probe = _FakeProbe(earlier)
    mode = gpu_loop._Forced({7}, 1 << 21, serial=False, probe=probe, targeted=targeted)
    assert mode.launch(lambda x: x + 1, (1,), {}, True) == 2
    assert (slept == [1 << 21]) == held and mode.sleeps == int(held)
    if held:
        assert probe.told == [earlier]
    # a host op (no CUDA tensor) is never held
    assert mode.launch(lambda x: x, (0,), {}, False) == 0 and mode.sleeps == int(held)


def test_a_device_run_takes_sglangs_kernel_and_stands_in_only_where_it_cannot_run() -> None:
    """The device sink: SGLang's own kernel runs (no host reads of index values); one that
    reaches a missing compiled op (the strict stand-in raises) gets the harness's torch
    implementation, for the rest of the run, and is named; ``stand_in`` takes the torch
    implementations throughout; a harness stand-in without one runs itself."""
    from overlap_harness.engines.core.strict import UnplannedUseError
    from overlap_harness.engines.sglang.gpu.loop import _StandInSink
    from recorder.kernels import KernelDeclaration

    calls: list[str] = []

    def triton_kernel(x: int) -> int:
        calls.append("sglang")
        return x + 1

    def compiled_kernel(x: int) -> int:
        calls.append("sglang-compiled")
        raise UnplannedUseError("sgl_kernel.tree_speculative_sampling: not on this host")

    def torch_implementation(x: int) -> int:
        calls.append("stand-in")
        return x + 1

    runs = KernelDeclaration("runs", lambda *a: [], torch_implementation)
    missing = KernelDeclaration("missing", lambda *a: [], torch_implementation)
    harness_only = KernelDeclaration("harness", lambda *a: [], None)
    sink = _StandInSink()
    assert sink.implementation(runs, triton_kernel)(1) == 2
    assert sink.implementation(missing, compiled_kernel)(1) == 2
    assert sink.implementation(missing, compiled_kernel)(1) == 2  # no second try
    assert sink.implementation(harness_only, triton_kernel)(1) == 2
    assert calls == ["sglang", "sglang-compiled", "stand-in", "stand-in", "sglang"]
    assert sink.stood_in == {"missing"}
    # each declared kernel's calls are counted; one that answers False declined to launch
    declines = KernelDeclaration("small_copy", lambda *a: [], torch_implementation)
    assert sink.implementation(declines, lambda x: False)(1) is False
    assert sink.calls == {"runs": 1, "small_copy (declined)": 1}
    calls.clear()
    assert _StandInSink("stand_in").implementation(runs, triton_kernel)(1) == 2
    assert calls == ["stand-in"]


def test_stand_in_writes_keep_the_cpu_modes_ops_off_a_real_device() -> None:
    """On CPU tensors (the CPU mode's device memory) the stand-ins' writes are the ops they
    always were (the loop reports' race sides unchanged); the device path is for CUDA."""
    import torch

    from overlap_harness.engines.sglang.stand_ins.eagle_models import (
        device_tensor,
        fill_slots,
        on_real_device,
    )

    kv = torch.zeros((5, 1))
    assert not on_real_device(kv)
    fill_slots(kv, torch.tensor([1, 3]), 1.0)
    assert kv.view(-1).tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert device_tensor([4, 5], torch.zeros(1, dtype=torch.int32)).tolist() == [4, 5]


def test_sglangs_own_kernel_is_one_device_op_of_the_forcing_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Triton launch is no dispatched op: while a trial's mode runs, the sink hands
    SGLang's kernel to it whole (held before it on a delayed stream, told to the probe after,
    its given tensors snapshotted where it returns none), and the torch ops inside it are
    not held a second time."""
    import torch

    from overlap_harness.engines.sglang.gpu.loop import _StandInSink
    from recorder.kernels import KernelDeclaration

    slept: list[int] = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda: type("S", (), {"cuda_stream": 7})())
    monkeypatch.setattr(torch.cuda, "_sleep", slept.append)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    taken: list = []

    class Capture:
        def location(self) -> str:
            return "sglang/srt/x.py:3"

        def capture(self, location: str, out: object) -> None:
            taken.append((location, out))

    probe = _FakeProbe(True)
    mode = gpu_loop._Forced({7}, 1 << 21, serial=False, probe=probe, targeted=True,
                            capture=Capture())
    launched: list[tuple] = []

    def triton_launch(out: object, device: torch.device) -> None:
        launched.append((out, device))
        # a torch op inside the kernel's own function reaches the mode as part of it
        assert mode.__torch_dispatch__(lambda: "inner", (), (), {}) == "inner"

    sink = _StandInSink()
    declaration = KernelDeclaration("k", lambda *a: [], lambda *a: None)
    sink.mode = mode
    cuda = torch.device("cuda")
    assert sink.implementation(declaration, triton_launch)("buf", cuda) is None
    assert launched == [("buf", cuda)]
    assert slept == [1 << 21] and mode.sleeps == 1  # held once, before the launch
    assert probe.told == [True]
    assert taken == [("sglang/srt/x.py:3", (("buf", cuda), {}))]
    sink.mode = None  # outside the loop: the kernel runs as itself
    assert sink.implementation(declaration, triton_launch)("b", cuda) is None
    assert mode.sleeps == 1


def test_a_delay_shorter_than_the_hosts_gap_gets_one_trial_that_outlasts_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # every delay held the earlier side, yet the later side always found it finished, the
    # soonest 60 ms after its op: one more trial, longer than 60 ms at the fastest clock
    done = {"earlier_issued": 9, "later_pending": 0, "later_done": 30, "later_first": 0,
            "least_done_gap_s": 0.06}
    asked = _scripted(monkeypatch, [{"sleeps": 9, "probe": done}] * 3
                      + [{"sleeps": 9, "probe": dict(done, later_pending=4, later_done=26)}])
    trials = gpu_table._race_trials(0, RACE_ROW, {})
    longer = asked[-1].cycles
    assert [f.cycles for f in asked[:3]] == list(gpu_table.RACE_CYCLES)
    assert len(asked) == 4 and asked[-1].targeted
    assert longer / gpu_table.FASTEST_CLOCK_HZ >= 0.06 and longer <= 1 << 28
    row = gpu_table._row(RACE_ROW, trials, None)
    assert (row["slept_trials"], row["race_made_trials"]) == (4, 1)
    # a gap the longest delay already outlasts, or one beyond a second: no more trials
    assert gpu_table.outlasting_cycles(Trial("x", probe=dict(done, least_done_gap_s=0.001)),
                                       1 << 25) is None
    assert gpu_table.outlasting_cycles(Trial("x", probe=dict(done, least_done_gap_s=5.0)),
                                       1 << 25) is None
    assert gpu_table.outlasting_cycles(Trial("x", probe={}), 1 << 25) is None
    # nor one that would hold the trial for minutes (1000 earlier ops of 0.18 s each)
    assert gpu_table.outlasting_cycles(Trial("x", probe=dict(done, earlier_issued=1000)),
                                       1 << 25) is None
    # a trial that was wrong stops the growth before any escalation
    asked = _scripted(monkeypatch, [{"sleeps": 9, "probe": done, "wrong": "r = 1 (serial 2)"}])
    assert len(gpu_table._race_trials(0, RACE_ROW, {})) == 1 and len(asked) == 1


def _event_class(finished: bool) -> type:
    """A stand-in for ``torch.cuda.Event`` whose work is always done (or never)."""

    class _Event:
        def record(self) -> None:
            pass

        def query(self) -> bool:
            return finished
    return _Event


def _later_side_frame() -> object:
    """A frame at EXAMPLE's later side (sglang/srt/alloc.py:452), as sys.setprofile hands it."""
    import types

    code = types.SimpleNamespace(co_filename="/x/sglang/srt/alloc.py")
    return types.SimpleNamespace(f_code=code, f_lineno=452, f_back=None)


def test_the_probe_measures_the_hosts_gap_to_a_finished_earlier_side(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from overlap_harness.engines.sglang.gpu import probe as gpu_probe

    clock = iter([10.0, 10.1, 10.25, 10.25, 10.4])
    monkeypatch.setattr(torch.cuda, "Event", _event_class(finished=True))
    monkeypatch.setattr(gpu_probe.time, "perf_counter", lambda: next(clock))
    probe = probes([EXAMPLE], "forward_stream")
    assert "least_done_gap_s" not in probe.counts()  # nothing measured yet
    later = _later_side_frame()
    probe.after_op(True)  # the earlier side's first op, at 10.0
    probe.after_op(True)  # and its second, at 10.1
    probe._profile(later, "c_call", len)  # the later side reached at 10.25: finished
    probe._profile(later, "c_call", len)  # and at 10.4
    counts = probe.counts()
    assert probe.later_done == 2 and counts["least_done_gap_s"] == 0.15
    assert counts["least_first_done_gap_s"] == 0.25 and "later_all_pending" not in counts
    # the escalation outlasts the longer of the two gaps (the first op's)
    longer = gpu_table.outlasting_cycles(Trial("x", probe=counts), 1 << 25)
    assert longer is not None and longer / gpu_table.FASTEST_CLOCK_HZ >= 0.25


def test_a_reach_that_finds_the_first_earlier_op_pending_counts_every_op_pending(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "Event", _event_class(finished=False))
    probe = probes([EXAMPLE], "forward_stream")
    later = _later_side_frame()
    probe.after_op(True)
    probe._profile(later, "c_call", len)
    probe._profile(later, "c_call", len)  # no earlier op since: not counted again
    counts = probe.counts()
    assert (counts["later_pending"], counts["later_all_pending"]) == (2, 1)
    assert "least_first_done_gap_s" not in counts


def test_a_row_wrong_only_at_an_escalated_delay_is_counted_apart() -> None:
    made = {"earlier_issued": 2, "later_pending": 1, "later_done": 0, "later_first": 0}
    fixed = gpu_table._row(RACE_ROW, [Trial("forward_stream@earlier+33554432cy", sleeps=2,
                                            probe=made, wrong="r = 1 (serial 2)")], None)
    escalated = gpu_table._row(RACE_ROW, [
        Trial("forward_stream@earlier+33554432cy", sleeps=2, probe=made),
        Trial("forward_stream@earlier+268435456cy", sleeps=2, probe=made,
              wrong="r = 1 (serial 2)")], None)
    counts = gpu_report.summary([fixed, dict(escalated, site="other.py:3")])
    assert counts["race_rows_wrong_or_made_crash"] == 2
    assert counts["race_rows_wrong_only_escalated"] == 1


def test_the_requests_acceptance_record_is_observed_and_compared_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    drafted = types.SimpleNamespace(rid="r1", output_ids=[7, 8], spec_verify_ct=3,
                                    spec_num_correct_drafts=5,
                                    spec_correct_drafts_histogram=[0, 1, 2])
    plain = types.SimpleNamespace(rid="r2", output_ids=[9], spec_verify_ct=0)
    pool = types.SimpleNamespace(req_to_token=torch.zeros((1, 2), dtype=torch.int32))
    run = types.SimpleNamespace(requests=[drafted, plain], scheduler=types.SimpleNamespace(
        req_to_token_pool=pool))
    values = gpu_loop.observe(run)
    assert values["acceptance.r1"] == {"spec_verify_ct": 3, "spec_num_correct_drafts": 5,
                                       "spec_correct_drafts_histogram": [0, 1, 2]}
    assert "acceptance.r2" not in values  # no verify pass: nothing drafted
    # a made race that cost accepted drafts, output right: wrong_acceptance, not wrong
    made = {"earlier_issued": 1, "later_pending": 1, "later_done": 0, "later_first": 0}
    unmade = dict(made, later_pending=0, later_done=1)
    fewer = "acceptance.r1 = {'spec_verify_ct': 4} (serial {'spec_verify_ct': 3})"
    row = gpu_table._row(RACE_ROW, [
        Trial("forward_stream@earlier+2097152cy", sleeps=1, probe=unmade),
        Trial("forward_stream@earlier+8388608cy", sleeps=1, probe=made,
              acceptance_wrong=fewer)], None)
    control = gpu_table._row(RACE_ROW, [Trial("forward_stream@earlier+2097152cy", sleeps=1,
                                              probe=unmade, acceptance_wrong=fewer)], None)
    report = gpu_report.document([row, dict(control, site="other.py:4")], version="0",
                                 device="d", torch_version="t", date="x", command="c",
                                 failures=[], seconds=0)
    by_site = {r["site"]: r for r in report["rows"]}
    first, second = by_site[RACE_ROW["site"]], by_site["other.py:4"]
    assert (first["why_reason"], first["wrong_trials"]) == ("wrong_acceptance", 0)
    assert "spec_verify_ct': 4" in first["why"]
    assert second["why_reason"] != "wrong_acceptance"  # not made: no evidence
    counts = report["summary"]
    assert counts["race_rows_value_shown"] == 1 and counts["race_rows_wrong_or_made_crash"] == 0
    assert counts["acceptance_wrong_unmade_trials"] == 1


def test_a_crash_that_did_not_make_the_race_does_not_stop_the_delay_growing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.sglang.gpu.command import stopped_at_unmade_crash

    unmade = {"earlier_issued": 2, "later_pending": 0, "later_done": 2, "later_first": 0}
    made = dict(unmade, later_pending=1, later_done=1)
    asked = _scripted(monkeypatch, [{"sleeps": 2, "probe": unmade, "error": "IndexError"},
                                    {"sleeps": 2, "probe": made, "error": "IndexError"}])
    trials = gpu_table._race_trials(0, RACE_ROW, {})
    assert [f.cycles for f in asked] == list(gpu_table.RACE_CYCLES[:2])
    row = gpu_table._row(RACE_ROW, trials, None)
    assert row["made_crashed_trials"] == 1 and not stopped_at_unmade_crash(row)
    # an earlier report's row that stopped at its first, unmade crash runs again
    stopped = gpu_table._row(RACE_ROW, trials[:1], None)
    assert stopped_at_unmade_crash(stopped)
    died = gpu_table._row(RACE_ROW, [Trial(trials[0].forcing, sleeps=2, probe=unmade,
                                           error="child failed: exit -6")], None)
    assert not stopped_at_unmade_crash(died)  # a dead child would die there again


def test_a_row_of_a_variant_that_races_as_released_keeps_the_mark() -> None:
    planned = dict(RACE_ROW, races_as_released=True)
    row = gpu_table._row(planned, [Trial(FIXED_LABEL, sleeps=1)], None)
    assert row["races_as_released"] is True
    assert "races_as_released" not in gpu_table._row(RACE_ROW, [Trial(FIXED_LABEL)], None)


def test_sigterm_stops_the_table_and_keeps_every_row_with_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal
    import subprocess
    import threading

    killed: list[str] = []

    class Endless:
        """A child that never finishes until killed."""

        def __init__(self, argv: list[str], **options: object) -> None:
            self.returncode = None

        def poll(self) -> None:
            return None

        def kill(self) -> None:
            killed.append("kill")

        def communicate(self) -> tuple[bytes, bytes]:
            killed.append("waited")
            return b"", b""

    monkeypatch.setattr(subprocess, "Popen", Endless)
    loop = {"variants": ["v"], "rows": [{"variant": "v", "site": RACE_ROW["site"],
                                         "code": "wait()", "real": "race",
                                         "race_examples": [EXAMPLE]}]}
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    rows, failures = gpu_table.run_table(loop, ["v"], jobs=2, timeout_s=60)
    # both children (the unmodified loop, the site), all killed before any is waited for
    assert killed == ["kill", "kill", "waited", "waited"]
    assert {r["error"] for r in rows} == {"not run: the run was stopped (SIGTERM)"}
    assert len(rows) == 2 and all(f.endswith("stopped (SIGTERM)") for f in failures)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler put back


def test_a_timing_row_names_the_declared_kernels_that_declined() -> None:
    unmade = {"earlier_issued": 0, "later_pending": 0, "later_done": 0, "later_first": 4}
    row = gpu_table._row(RACE_ROW, [Trial(FIXED_LABEL, sleeps=0, probe=unmade,
                                          declared_kernel_calls={"small_copy (declined)": 3})],
                         None)
    report = gpu_report.document([row], version="0", device="d", torch_version="t",
                                 date="x", command="c", failures=[], seconds=0)
    [done] = report["rows"]
    assert done["why_reason"] == "timing"
    assert done["why"].endswith("declared kernels that declined to launch: small_copy "
                                "(declined)")


def test_a_row_whose_delays_grew_past_its_unmade_crash_is_not_run_again() -> None:
    from overlap_harness.engines.sglang.gpu.command import stopped_at_unmade_crash

    unmade = {"earlier_issued": 2, "later_pending": 0, "later_done": 2, "later_first": 0}
    grew = gpu_table._row(RACE_ROW, [
        Trial(f"forward_stream@earlier+{cycles}cy", sleeps=2, probe=unmade,
              error="IndexError" if cycles == gpu_table.RACE_CYCLES[0] else None)
        for cycles in gpu_table.RACE_CYCLES], None)
    assert not stopped_at_unmade_crash(grew)


def test_a_row_whose_child_died_before_its_probe_answered_says_so() -> None:
    died = gpu_table._row(RACE_ROW, [Trial(FIXED_LABEL, error="child failed: exit -6: "
                                           "CUDA error: an illegal memory access")], None)
    report = gpu_report.document([died], version="0", device="d", torch_version="t",
                                 date="x", command="c", failures=[], seconds=0)
    [row] = report["rows"]
    assert row["why_reason"] == "unprobed"
    assert "crashed before their probe could count" in row["why"]
    assert "illegal memory access" in row["why"]


def test_a_made_race_that_showed_nothing_and_measured_no_gap_gets_the_longest_held_delay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Made at every fixed delay, equal every time, no host gap measured: one more trial at
    the longest delay the hold budget allows for the earlier side's op count; an unmade row
    gets none (a longer delay of a side the later one never overlapped proves nothing)."""
    made = {"earlier_issued": 14, "later_pending": 2, "later_done": 0, "later_first": 0}
    asked = _scripted(monkeypatch, [{"sleeps": 14, "probe": made}] * 4)
    trials = gpu_table._race_trials(0, RACE_ROW, {})
    assert [f.cycles for f in asked] == [*gpu_table.RACE_CYCLES, 1 << 31]
    assert len(trials) == 4 and asked[-1].targeted
    # the budget: 200 ops held 2^30 cycles each would sleep past LONGEST_HELD_S
    many = Trial("x", sleeps=200, probe=dict(made, earlier_issued=200))
    assert gpu_table.longest_held_cycles(many, 1 << 25) == 1 << 29
    assert gpu_table.longest_held_cycles(
        Trial("x", probe=dict(made, earlier_issued=10_000)), 1 << 25) is None
    unmade = dict(made, later_pending=0, later_done=2)
    asked = _scripted(monkeypatch, [{"sleeps": 14, "probe": unmade}] * 3)
    assert len(gpu_table._race_trials(0, RACE_ROW, {})) == 3
