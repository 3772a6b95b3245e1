"""Forced trials start from dirtied caches (gpu/access_values.dirty_caches): a read that runs
before its write lands finds a pattern, never the serial run's right answer left in a reused
block. No device: the allocations are recorded on the CPU, the trials are scripted, and what
is checked is what the harness's code computes from them."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from overlap_harness.engines.sglang.gpu import access_values, twins
from overlap_harness.engines.sglang.gpu import loop as gpu_loop
from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu.command import (
    _resumed,
    unshown_before_dirtying,
    with_earlier_trials,
)
from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
from overlap_harness.engines.sglang.gpu.loop import Forcing, Trial

FIXED = f"copy_stream@earlier+{RACE_CYCLES[-1]}cy"
#: so many ops held that no longer delay fits the hold budget (table.longest_held_cycles):
#: a row of such trials does not grow further on a resumed run (command.grows_further)
MADE = {"earlier_issued": 10_000, "later_pending": 1, "later_done": 0, "later_first": 0}
UNMADE = dict(MADE, later_pending=0, later_done=2)


def test_the_host_cache_is_dirtied_in_every_power_of_two_block(monkeypatch) -> None:
    """Page-locked blocks of each power-of-two size from 8 bytes to 1 MiB, several of each
    (the host allocator reuses the last freed block of a size first), filled with the
    pattern."""
    made: list[tuple[int, bool]] = []
    filled: list[int] = []
    real_empty = torch.empty

    class Recorded(torch.Tensor):
        def fill_(self, value):  # the fill the allocator's next user starts from
            filled.append(int(value))
            return super().fill_(value)

    def recording_empty(size, **kwargs):
        made.append((size[0], kwargs.pop("pin_memory", False)))
        return real_empty(size, **kwargs).as_subclass(Recorded)

    monkeypatch.setattr(torch, "empty", recording_empty)
    total = access_values.dirty_host_cache()
    sizes = sorted({size for size, _ in made})
    assert sizes[0] == 8 and sizes[-1] == 1 << 20
    assert all(size & (size - 1) == 0 for size in sizes)  # powers of two only
    assert all(pinned for _, pinned in made)
    assert len(made) == len(sizes) * access_values.DIRTY_BLOCKS_PER_SIZE
    assert filled == [access_values.DIRTY_BYTE] * len(made)
    assert total == sum(size for size, _ in made)


def test_a_forced_trial_starts_from_dirtied_caches_and_the_serial_run_does_not(
        monkeypatch) -> None:
    """run_trial dirties both caches before a forced run (the trial says so in ``dirtied``),
    never before the serial answer; a crashed forced trial says it too."""
    from overlap_harness.engines.sglang import driver

    calls: list[str] = []
    monkeypatch.setattr(access_values, "dirty_caches", lambda: calls.append("dirty") or 64)

    def crashing_run(variant, run):
        calls.append(run.plan.label())
        raise RuntimeError("the loop stopped")

    monkeypatch.setattr(driver, "run_variant", crashing_run)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    forced, _, _ = gpu_loop.run_trial("non_spec_decode", Forcing(("copy_stream",), 8), None)
    serial, _, _ = gpu_loop.run_trial("non_spec_decode", Forcing(serial=True), None)
    assert calls == ["dirty", "copy_stream+8cy", "serial"]
    assert forced.dirtied and forced.error and not serial.dirtied


def test_a_trial_collects_the_garbage_before_it_and_none_during_it(monkeypatch) -> None:
    """What an earlier trial left is collected before the next one dirties its caches, and
    the cyclic collector stays off while the loop runs (a free inside SGLang's graph capture
    could invalidate it), on again after, a crashed trial too."""
    import gc

    from overlap_harness.engines.sglang import driver

    calls: list[str] = []
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append("collect") or 0)
    monkeypatch.setattr(access_values, "dirty_caches", lambda: calls.append("dirty") or 64)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def run(variant, run):
        calls.append(f"run, collector {'on' if gc.isenabled() else 'off'}")
        raise RuntimeError("the loop stopped")

    monkeypatch.setattr(driver, "run_variant", run)
    assert gc.isenabled()
    for _ in range(2):
        trial, _, _ = gpu_loop.run_trial("non_spec_decode", Forcing(("copy_stream",), 8), None)
        assert trial.error and gc.isenabled()
    assert calls == ["collect", "dirty", "run, collector off"] * 2


def test_evidence_from_dirtied_caches_needs_a_twin_at_any_delay() -> None:
    """The unmodified loop's kept control trials did not start from dirtied caches, so a
    dirtied trial's wrong value or made crash is controlled only by its twin."""
    wrong = asdict(Trial(FIXED, sleeps=2, probe=MADE, wrong="r1.output_ids[0] = 5"))
    assert not twins.needs_twin(wrong)
    assert twins.needs_twin({**wrong, "dirtied": True})
    crash = asdict(Trial(FIXED, sleeps=2, probe=MADE, error="IndexError", dirtied=True))
    assert twins.needs_twin(crash)
    assert not twins.needs_twin({**crash, "probe": UNMADE})  # unmade crash: no evidence
    assert not twins.needs_twin(asdict(Trial(FIXED, sleeps=2, probe=MADE, dirtied=True)))


def _row(site: str | None, **trial: object) -> dict:
    details = [asdict(Trial(FIXED, sleeps=2, probe=trial.pop("probe", MADE), **trial))]
    return {"variant": "v", "site": site, "code": "x.synchronize()", "cpu_verdict": "race",
            "trials": 1, "wrong_trials": int(bool(details[0]["wrong"])),
            "trial_details": details, "probes": []}


@pytest.mark.parametrize(("row", "runs_again"), [
    (_row("a.py:1"), True),  # made, nothing shown, not dirtied
    (_row("a.py:2", dirtied=True), False),  # already from dirtied caches
    (_row("a.py:3", wrong="r1.output_ids[0] = 5 (serial 60)"), False),
    (_row("a.py:4", access_wrong="a.py:4, its op 1: [0] (serial [1])"), True),  # no wrong
    (_row("a.py:5", probe=UNMADE), True),  # not made: another chance, from dirtied caches
    (_row("a.py:6", error="IndexError"), False),  # a made crash
    (_row(None), True),  # a released race's own unmodified loop, made, nothing shown
])
def test_rerun_unshown_runs_rows_without_a_wrong_value_or_made_crash_again(
        tmp_path: Path, row: dict, runs_again: bool) -> None:
    assert unshown_before_dirtying(row) is runs_again
    earlier = {"sglang_version": "0.5.23", "device": "d", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "t", "rows": [row]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept = _resumed(path, "0.5.23", "unshown")[0]
    assert [r["site"] for r in kept] == ([] if runs_again else [row["site"]])
    assert [r["site"] for r in _resumed(path, "0.5.23", "unrun")[0]] == [row["site"]]


def test_a_row_run_again_keeps_its_earlier_trials_and_names_both_devices() -> None:
    """The earlier trial's access value stays shown beside the new dirtied trial's wrong
    value; the counts are recomputed from both; a row that ran nothing now stays as it
    was."""
    old = dict(_row("a.py:1", access_wrong="a.py:1, its op 1: [0] (serial [1])"),
               device="H100", torch="2.11")
    gone = dict(_row("a.py:2"), device="H100", torch="2.11")
    earlier = {"device": "H100", "torch": "2.11", "rows": [old, gone]}
    new = dict(_row("a.py:1", dirtied=True, wrong="r1.output_ids[0] = 5 (serial 60)"),
               device="H200", torch="2.11")
    unrun = {"variant": "v", "site": "a.py:2", "code": "x", "cpu_verdict": "race",
             "trials": 0, "error": "not run: the run's deadline", "device": "H200",
             "torch": "2.11"}
    merged, kept = with_earlier_trials([new, unrun], earlier)
    assert merged["trials"] == 2 and merged["wrong_trials"] == 1
    assert merged["made_access_wrong_trials"] == 1
    assert [t["dirtied"] for t in merged["trial_details"]] == [False, True]
    assert merged["device"] == "H100, H200" and merged["torch"] == "2.11"
    assert kept == gone


def test_the_summary_counts_dirtied_trials_twins_included() -> None:
    row = _row("a.py:1", dirtied=True, wrong="r1.output_ids[0] = 5 (serial 60)")
    row["twin_trials"] = [asdict(Trial(FIXED, sleeps=2, probe=MADE, dirtied=True))]
    plain = _row("a.py:2", wrong="r1.output_ids[0] = 5 (serial 60)")
    summary = gpu_report.document([row, plain], version="0.5.23", device="d",
                                  torch_version="t", date="d", command="c", failures=[],
                                  seconds=1.0)["summary"]
    assert summary["trials_dirtied"] == 2
    assert summary["race_rows_value_shown_controlled"] == 2  # a.py:1 by its equal twin


def test_a_row_without_a_site_has_no_twin_and_its_evidence_no_control() -> None:
    """A released race's own unmodified loop: putting nothing back would run the same loop
    again, so no twin is asked for and a dirtied wrong value stays uncontrolled."""
    row = dict(_row(None, dirtied=True, wrong="r1.output_ids[0] = 5 (serial 60)"),
               races_as_released=True)
    trial = row["trial_details"][0]
    assert twins.needs_twin(trial, released=True)
    assert twins.twin_labels(row) == [] and twins.missing_twins(row) == []
    assert not twins.controlled(row, trial)
    assert twins.controlled(dict(row, site="a.py:1", twin_trials=[
        asdict(Trial(FIXED, sleeps=2, probe=MADE, dirtied=True))]), trial)


def _grown(cycles: tuple[int, ...], **fields: object) -> dict:
    made = dict(MADE, earlier_issued=14)
    details = [asdict(Trial(f"copy_stream@earlier+{c}cy", sleeps=14, probe=made,
                            dirtied=True, **fields)) for c in cycles]
    return {"variant": "v", "site": "a.py:9", "code": "x", "cpu_verdict": "race",
            "trials": len(details), "wrong_trials": 0, "trial_details": details,
            "probes": [], "device": "H200", "torch": "2.11"}


def test_a_made_row_that_stopped_at_the_fixed_steps_runs_again_and_keeps_its_trials(
        tmp_path: Path) -> None:
    """The delay now grows past the fixed steps where a made race showed nothing
    (table.longest_held_cycles): a row whose trials stopped there runs again in any mode,
    and the new trials join the old ones; a row that already grew, or showed a wrong
    value, or never made its race, stays."""
    from overlap_harness.engines.sglang.gpu.command import grows_further

    stopped = _grown(RACE_CYCLES)
    assert grows_further(stopped)
    assert not grows_further(_grown((*RACE_CYCLES, 1 << 31)))
    assert not grows_further(_grown(RACE_CYCLES, wrong="r1.output_ids[0] = 5 (serial 36)"))
    assert not grows_further(dict(stopped, trial_details=[
        dict(t, probe=UNMADE) for t in stopped["trial_details"]]))
    earlier = {"sglang_version": "0.5.23", "device": "H200", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "2.11", "rows": [stopped]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    assert _resumed(path, "0.5.23", "unrun")[0] == []
    grown = _grown((1 << 31,), wrong="r1.output_ids[0] = 5 (serial 36)")
    [merged] = with_earlier_trials([dict(grown, device="H100")], earlier, "unrun")
    assert merged["trials"] == 4 and merged["wrong_trials"] == 1
    assert merged["device"] == "H200, H100"


def test_a_row_a_deadline_stopped_runs_again_unless_its_trials_are_evidence(
        tmp_path: Path) -> None:
    """An unmodified loop stopped after one stream's trials is no control of the others: it
    runs again in any mode, as does a race row stopped before it showed anything (its trials
    kept); a race row that showed a wrong value before the stop, and a row whose child died,
    stay."""
    from overlap_harness.engines.sglang.gpu.command import stopped_short

    stop = "not run: the run's deadline"
    control = {"variant": "v", "site": None, "code": None, "cpu_verdict": None, "trials": 1,
               "wrong_trials": 0, "aborted": stop, "trial_details": [
                   asdict(Trial("copy_stream+2097152cy", sleeps=3, acceptance_wrong=None))]}
    race = dict(_grown((1 << 21,)), aborted=stop, site="a.py:1")
    shown = dict(_grown((1 << 21,), wrong="r1.output_ids[0] = 5 (serial 36)"), aborted=stop,
                 site="a.py:2", wrong_trials=1)
    died = dict(_grown((1 << 31,)), site="a.py:3", aborted="child failed: exit -6: CUDA error")
    assert [stopped_short(r) for r in (control, race, shown, died)] == [
        True, True, False, False]
    earlier = {"sglang_version": "0.5.23", "device": "H200", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "2.11",
               "rows": [control, race, shown, died]}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept = _resumed(path, "0.5.23", "unrun")[0]
    assert [r["site"] for r in kept] == ["a.py:2", "a.py:3"]
    again = dict(_grown((1 << 23,)), site="a.py:1")
    [merged] = with_earlier_trials([again], earlier, "unrun")
    assert merged["trials"] == 2 and "aborted" not in merged
