"""Twin trials (gpu/twins.py): a race row's forcing again on the unmodified code, the control
of an escalated delay and of a value shown only at an access or in the acceptance record.
No device: the trials are scripted, the counts are what the report code computes."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from overlap_harness.engines.sglang.gpu import loop as gpu_loop
from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu import table as gpu_table
from overlap_harness.engines.sglang.gpu import twins
from overlap_harness.engines.sglang.gpu.loop import Forcing, Trial

EXAMPLE = ("RAW x@a.py:1: write on self.forward_stream at sglang/srt/w.py:5 / "
           "read on self.schedule_stream at sglang/srt/r.py:7")
RACE_ROW = {"variant": "v", "site": "sglang/srt/s.py:9", "code": "wait()",
            "cpu_verdict": "race", "delay": ["forward_stream"], "race_examples": [EXAMPLE]}
MADE = {"earlier_issued": 2, "later_pending": 1, "later_done": 0, "later_first": 0}
UNMADE = dict(MADE, later_pending=0, later_done=2)
FIXED = f"forward_stream@earlier+{gpu_table.RACE_CYCLES[-1]}cy"
ESCALATED = f"forward_stream@earlier+{gpu_table.RACE_CYCLES[-1] * 8}cy"


def _trial(label: str, **fields: object) -> dict:
    return asdict(Trial(label, sleeps=fields.pop("sleeps", 2), **fields))


def test_only_evidence_outside_the_fixed_control_needs_a_twin() -> None:
    assert twins.needs_twin(_trial(ESCALATED, probe=MADE, wrong="r = 1 (serial 2)"))
    assert twins.needs_twin(_trial(ESCALATED, probe=MADE, error="CUDA error"))
    assert not twins.needs_twin(_trial(ESCALATED, probe=UNMADE, error="CUDA error"))
    assert not twins.needs_twin(_trial(FIXED, probe=MADE, wrong="r = 1 (serial 2)"))
    assert twins.needs_twin(_trial(FIXED, probe=MADE, access_wrong="a.py:1, its op 1: [0]"))
    assert twins.needs_twin(_trial(FIXED, probe=MADE, acceptance_wrong="acceptance.r1 = 3"))
    assert not twins.needs_twin(_trial(FIXED, probe=UNMADE, access_wrong="a.py:1: [0]"))
    assert not twins.needs_twin(_trial(ESCALATED, probe=MADE, sleeps=0, wrong="r = 1"))
    assert not twins.needs_twin(_trial("none", wrong="r = 1"))


def test_twins_run_each_needed_forcing_after_the_site_is_put_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[object] = []

    def fake(variant: str, forcing: Forcing, serial: dict, probe: object = None,
             access_locations: tuple = ()) -> tuple:
        events.append(forcing)
        assert probe is not None and set(access_locations) == {"sglang/srt/w.py:5",
                                                               "sglang/srt/r.py:7"}
        return Trial(forcing.label(), sleeps=2, probe=UNMADE), {}, []

    monkeypatch.setattr(gpu_loop, "run_trial", fake)
    monkeypatch.setattr(gpu_table, "_journal", lambda entry: None)
    row = gpu_table._row(RACE_ROW, [
        Trial(FIXED, sleeps=2, probe=MADE, access_wrong="sglang/srt/r.py:7, its op 1: [9]"),
        Trial(ESCALATED, sleeps=2, probe=MADE, wrong="r = 1 (serial 2)"),
        Trial(FIXED, sleeps=2, probe=MADE, access_wrong="sglang/srt/r.py:7, its op 2: [9]")],
        None)
    out = gpu_table._with_twins([RACE_ROW], [row], {"v": {}}, lambda: events.append("undo"))
    assert events[0] == "undo"
    assert [(f.streams, f.targeted, f.cycles) for f in events[1:]] == [
        (("forward_stream",), True, gpu_table.RACE_CYCLES[-1]),
        (("forward_stream",), True, gpu_table.RACE_CYCLES[-1] * 8)]
    assert [t["forcing"] for t in out[0]["twin_trials"]] == [FIXED, ESCALATED]
    # nothing to twin: the removal stays, nothing runs
    events.clear()
    plain = gpu_table._row(RACE_ROW, [Trial(FIXED, sleeps=2, probe=MADE, wrong="r = 1")], None)
    gpu_table._with_twins([RACE_ROW], [plain], {"v": {}}, lambda: events.append("undo"))
    assert events == []


def _summary(rows: list[dict]) -> dict:
    return gpu_report.document(rows, version="0", device="d", torch_version="t", date="x",
                               command="c", failures=[], seconds=0)["summary"]


def test_a_value_shown_counts_as_controlled_only_with_an_equal_twin() -> None:
    shown = gpu_table._row(RACE_ROW, [
        Trial(FIXED, sleeps=2, probe=MADE),
        Trial(ESCALATED, sleeps=2, probe=MADE, wrong="r = 1 (serial 2)")], None)
    equal = asdict(Trial(ESCALATED, sleeps=2, probe=UNMADE))
    differing = asdict(Trial(ESCALATED, sleeps=2, probe=UNMADE, wrong="r = 1 (serial 2)"))
    at_access = gpu_table._row(RACE_ROW, [Trial(FIXED, sleeps=2, probe=MADE,
                                                access_wrong="r.py:7, its op 1: [9]")], None)
    fixed = gpu_table._row(RACE_ROW, [Trial(FIXED, sleeps=2, probe=MADE, wrong="r = 1")], None)
    counts = _summary([
        dict(shown, site="a.py:1", twin_trials=[equal]),
        dict(shown, site="b.py:2", twin_trials=[differing]),
        dict(shown, site="c.py:3"),
        dict(at_access, site="d.py:4", twin_trials=[asdict(Trial(FIXED, sleeps=2))]),
        dict(at_access, site="e.py:5"),
        dict(fixed, site="f.py:6")])
    assert counts["race_rows_value_shown"] == 6
    assert counts["race_rows_value_shown_controlled"] == 3  # a, d (twins equal), f (fixed)
    assert (counts["twin_trials"], counts["twin_trials_differing"]) == (3, 1)
    assert counts["race_rows_twin_missing"] == 2  # c, e


def test_a_resumed_run_twins_the_kept_rows_and_merges_what_ran() -> None:
    kept = gpu_table._row(RACE_ROW, [Trial(ESCALATED, sleeps=2, probe=MADE, wrong="r = 1")],
                          None)
    done = dict(kept, site="sglang/srt/t.py:3",
                twin_trials=[asdict(Trial(ESCALATED, sleeps=2))])
    loop = {"rows": [{"variant": "v", "site": RACE_ROW["site"], "race_examples": [EXAMPLE]},
                     {"variant": "v", "site": "sglang/srt/t.py:3",
                      "race_examples": [EXAMPLE]}]}
    work = gpu_table.twin_work([kept, done], loop)
    assert [(w["site"], w["twin_forcings"], w["delay"]) for w in work] == [
        (RACE_ROW["site"], [ESCALATED], ["forward_stream"])]
    plan = gpu_table.plan({"variants": ["v"], "rows": []}, twin_rows=work)
    assert work[0] in plan[None]  # nothing removed in that child
    ran = [{"variant": "v", "site": RACE_ROW["site"], "code": "wait()", "cpu_verdict": "race",
            "twin_only": True, "twin_trials": [asdict(Trial(ESCALATED, sleeps=2))]},
           {"variant": "v", "site": None, "cpu_verdict": None, "trials": 1}]
    rows, others = twins.merged([kept, done], ran)
    assert [len(r["twin_trials"]) for r in rows] == [1, 1]
    assert others == [ran[1]]
    assert twins.missing_twins(rows[0]) == []


def test_a_child_that_dies_in_a_twin_keeps_the_row_and_fails_its_control(
        tmp_path: Path) -> None:
    journal = tmp_path / "journal0.jsonl"
    finished = _trial(ESCALATED, probe=MADE, wrong="r = 1 (serial 2)")
    journal.write_text("\n".join(json.dumps(e) for e in [
        {"row": 0, "starting": ESCALATED}, {"row": 0, "trial": finished},
        {"row": 0, "twin_starting": ESCALATED}]) + "\n")
    [row] = gpu_table.from_journal([RACE_ROW], journal, "exit -6: CUDA error")
    assert row["trials"] == 1 and row["wrong_trials"] == 1  # the row's own trial stands
    assert [t["error"] for t in row["twin_trials"]] == ["exit -6: CUDA error"]
    assert not twins.controlled(row, row["trial_details"][0])


def test_a_twin_only_row_runs_its_twins_in_a_child_that_removes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.gpu import access_values

    asked: list[Forcing] = []

    def fake(variant: str, forcing: Forcing, serial: dict | None, probe: object = None,
             access_locations: tuple = ()) -> tuple:
        asked.append(forcing)
        return Trial(forcing.label(), sleeps=0 if forcing.serial else 2), {"access": {}}, []

    monkeypatch.setattr(environment, "load", lambda source=None: None)
    monkeypatch.setattr(access_values, "dirty_caches", lambda: 0)  # needs CUDA
    monkeypatch.setattr(gpu_loop, "run_trial", fake)
    monkeypatch.setattr(gpu_table, "_journal", lambda entry: None)
    work = dict(RACE_ROW, twin_only=True, twin_forcings=[ESCALATED])
    [row] = gpu_table.run_site(None, [work])
    assert row["twin_only"] and [t["forcing"] for t in row["twin_trials"]] == [ESCALATED]
    assert [f.serial for f in asked] == [True, True, False]  # the serial twice, the twin
    assert "trials" not in row  # no trial of its own: the kept row keeps its own


def test_a_variant_that_races_as_released_has_no_fixed_control() -> None:
    wrong = _trial(FIXED, probe=MADE, wrong="r = 1 (serial 2)")
    assert not twins.needs_twin(wrong) and twins.needs_twin(wrong, released=True)
    released = dict(gpu_table._row(dict(RACE_ROW, races_as_released=True), [
        Trial(FIXED, sleeps=2, probe=MADE, wrong="r = 1 (serial 2)")], None))
    assert twins.twin_labels(released) == [FIXED]
    counts = _summary([released, dict(released, site="b.py:2",
                                      twin_trials=[asdict(Trial(FIXED, sleeps=2))])])
    assert counts["race_rows_value_shown_controlled"] == 1  # b: its twin stayed equal
    assert counts["race_rows_twin_missing"] == 1


def test_a_redundant_row_that_differed_gets_a_twin_that_says_whose_difference_it_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A race-free row's trial that did not stay equal (in a variant that races as released,
    its delay can make that race) is run again with the site back, unprobed as its sweep
    ran; the summary counts the rows whose twin differed too and those whose twin stayed
    equal (the removal's difference: a CPU verdict to check)."""
    sweep = "copy_stream+2097152cy"
    free_row = {"variant": "v", "site": "sglang/srt/f.py:4", "code": "x.synchronize()",
                "cpu_verdict": "race_free", "delay": [], "races_as_released": True}
    row = gpu_table._row(free_row, [Trial(sweep, sleeps=3, wrong="r1.output_ids[0] = 5"),
                                    Trial("plan_stream+2097152cy", sleeps=3)], None)
    assert twins.twin_labels(row) == [sweep]
    asked: list[tuple] = []

    def fake(variant: str, forcing: Forcing, serial: dict, probe: object = None,
             access_locations: tuple = ()) -> tuple:
        asked.append((forcing.label(), probe, access_locations))
        return Trial(forcing.label(), sleeps=3, wrong="r1.output_ids[0] = 5"), {}, []

    monkeypatch.setattr(gpu_loop, "run_trial", fake)
    monkeypatch.setattr(gpu_table, "_journal", lambda entry: None)
    [done] = gpu_table._with_twins([free_row], [dict(row)], {"v": {}}, lambda: None)
    assert asked == [(sweep, None, ())]
    equal = dict(done, site="sglang/srt/g.py:5",
                 twin_trials=[asdict(Trial(sweep, sleeps=3))])
    counts = _summary([done, equal])
    assert counts["race_free_rows_wrong_twin_differs"] == 1
    assert counts["race_free_rows_wrong_twin_equal"] == 1
    # a kept redundant row lacking its twin is twin work, with no race to probe
    loop = {"rows": [{"variant": "v", "site": free_row["site"], "race_examples": []}]}
    [work] = gpu_table.twin_work([row], loop)
    assert (work["cpu_verdict"], work["delay"], work["twin_forcings"]) == (
        "race_free", [], [sweep])
