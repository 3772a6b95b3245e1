"""Nothing a device run showed is lost when the run ends early or its report cannot come back:
a row the deadline left unrun keeps its earlier trials (an unmodified loop's control too), a
died or stopped child's rows reach the progress file, and a report rebuilt from that file
keeps a re-run row's earlier trials beside the new ones, as the run itself would have. No
device: the trials are scripted; what is checked is what the harness's code computes."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

from overlap_harness.engines.sglang.gpu import table as gpu_table
from overlap_harness.engines.sglang.gpu.command import with_earlier_trials
from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
from overlap_harness.engines.sglang.gpu.loop import Trial

LABEL = f"copy_stream@earlier+{RACE_CYCLES[0]}cy"
MADE = {"earlier_issued": 10_000, "later_pending": 1, "later_done": 0, "later_first": 0}
UNRUN = "not run: the run's deadline"


def _ran(site: str | None, verdict: str | None, **trial: object) -> dict:
    details = [asdict(Trial(LABEL, sleeps=2, probe=MADE, **trial))]
    return {"variant": "v", "site": site, "code": "x.synchronize()", "cpu_verdict": verdict,
            "trials": 1, "wrong_trials": int(bool(details[0]["wrong"])),
            "trial_details": details, "probes": [], "device": "H100", "torch": "2.11"}


def _unrun(site: str | None, verdict: str | None, **plan: object) -> dict:
    return {"variant": "v", "site": site, "code": "x.synchronize()", "cpu_verdict": verdict,
            "trials": 0, "error": UNRUN, "device": "H200", "torch": "2.11", **plan}


def test_a_row_the_deadline_left_unrun_keeps_its_earlier_trials_whatever_its_verdict() -> None:
    """An unmodified loop selected to run again (it was stopped short before) that the
    deadline then left unrun is its earlier control, not an error; so is a redundant row.
    A row whose plan changed (it now races as released) ran for another verdict before and
    stays unrun."""
    control = _ran(None, None)
    redundant = _ran("a.py:2", "race_free")
    changed = _ran("a.py:3", "race_free")
    earlier = {"device": "H100", "torch": "2.11", "rows": [control, redundant, changed]}
    out = with_earlier_trials([_unrun(None, None), _unrun("a.py:2", "race_free"),
                               _unrun("a.py:3", "race_free", races_as_released=True)],
                              earlier)
    assert out[0] == control and out[1] == redundant
    assert out[2]["error"] == UNRUN and out[2]["trials"] == 0


def test_a_died_or_stopped_childs_rows_reach_the_progress_file(tmp_path: Path) -> None:
    """The rows a died child's journal gives (its finished trials, the trial it died in)
    are written to the progress file like a finished child's; a row that ran nothing is
    not (the report says why, the file holds evidence only)."""
    rows = [{**_unrun(site, "race"), "delay": ["copy_stream"]} for site in ("a.py:1", "a.py:2")]
    journal = tmp_path / "journal0.jsonl"
    journal.write_text("\n".join(json.dumps(entry) for entry in (
        {"row": 0, "trial": asdict(Trial(LABEL, sleeps=2, probe=MADE))},
        {"row": 0, "starting": f"copy_stream@earlier+{RACE_CYCLES[1]}cy"},
    )) + "\n")
    progress = tmp_path / "gpu-rows.jsonl"
    collected: list[dict] = []
    gpu_table._add(collected, gpu_table.from_journal(rows, journal, "exit -6: CUDA error"),
                   progress)
    written = [json.loads(line) for line in progress.read_text().splitlines()]
    assert [r["site"] for r in collected] == ["a.py:1", "a.py:2"]
    assert [r["site"] for r in written] == ["a.py:1"]
    assert written[0]["trials"] == 2 and written[0]["crashed_trials"] == 1
    twin_only = {"variant": "v", "site": "a.py:3", "code": "x", "cpu_verdict": "race",
                 "twin_only": True, "twin_trials": [asdict(Trial(LABEL, sleeps=2))]}
    gpu_table._add(collected, [twin_only, dict(twin_only, site="a.py:4", twin_trials=[])],
                   progress)
    assert [json.loads(line)["site"] for line in progress.read_text().splitlines()] == [
        "a.py:1", "a.py:3"]


def _recount_tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "sglang_gpu_recount.py"
    spec = importlib.util.spec_from_file_location("sglang_gpu_recount", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_report_rebuilt_from_progress_keeps_a_rerun_rows_earlier_trials() -> None:
    """``--gpu-rerun unshown`` ran a row again; its run was stopped before its report. The
    rebuilt row holds the earlier trial and the new one (the device run would have merged
    them), with both devices named; a row the progress file lacks stays as it was."""
    old = _ran("a.py:1", "race", access_wrong="a.py:1, its op 1: [0] (serial [1])")
    other = _ran("a.py:2", "race", wrong="r1.output_ids[0] = 5 (serial 60)")
    report = {"device": "H100", "torch": "2.11", "rows": [old, other]}
    new = _ran("a.py:1", "race", dirtied=True, wrong="r1.output_ids[0] = 5 (serial 60)")
    del new["device"], new["torch"]  # a progress row names neither
    rows, came = _recount_tool().with_progress(report, [new], "H200", "2.11", "unshown")
    merged = next(r for r in rows if r["site"] == "a.py:1")
    assert came == 1 and merged["trials"] == 2 and merged["wrong_trials"] == 1
    assert merged["made_access_wrong_trials"] == 1
    assert merged["device"] == "H100, H200"
    assert next(r for r in rows if r["site"] == "a.py:2") == other


def test_a_resumed_run_of_some_variants_keeps_every_row_of_the_others(tmp_path: Path) -> None:
    """``--variant w --gpu-resume``: the rows of ``v``, which this run does not name, stay in
    the report as they were, the unsettled ones too (before, they were dropped, neither kept
    nor run); ``w``'s unsettled row runs again."""
    from overlap_harness.engines.sglang.gpu.command import _resumed

    unshown = _ran("a.py:1", "race")  # made, nothing shown, not dirtied: runs again
    shown = _ran("a.py:2", "race", wrong="r1.output_ids[0] = 5 (serial 60)")
    other_variant = [dict(unshown, variant="v"), dict(shown, variant="v")]
    this_variant = [dict(unshown, variant="w"), dict(shown, variant="w")]
    earlier = {"sglang_version": "0.5.23", "device": "H100", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "2.11",
               "rows": other_variant + this_variant}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    planned = {("w", "a.py:1"): ("race", False), ("w", "a.py:2"): ("race", False)}
    kept = _resumed(path, "0.5.23", "unshown", planned)[0]
    assert sorted((r["variant"], r["site"]) for r in kept) == [
        ("v", "a.py:1"), ("v", "a.py:2"), ("w", "a.py:2")]


def test_a_control_with_a_crashed_trial_is_no_bit_identical_row_and_runs_again(
        tmp_path: Path) -> None:
    """A redundant row and an unmodified loop whose trials all equal the serial answer but
    one crashed are counted apart, not as bit-identical; a resumed run runs them again in
    any mode. A redundant row that only stayed equal is kept and counted equal."""
    from overlap_harness.engines.sglang.gpu import report as gpu_report
    from overlap_harness.engines.sglang.gpu.command import _resumed

    def control(site: str | None, verdict: str | None, crash: bool) -> dict:
        details = [asdict(Trial(LABEL, sleeps=2)),
                   asdict(Trial(LABEL, sleeps=0, error="Exception: capture failed"
                                if crash else None))]
        return {"variant": "v", "site": site, "code": "x", "cpu_verdict": verdict,
                "trials": 2, "wrong_trials": 0, "trial_details": details, "probes": [],
                "device": "H100", "torch": "2.11"}

    rows = [gpu_table.recounted(row) for row in (
        control("a.py:1", "race_free", True), control(None, None, True),
        control("a.py:2", "race_free", False))]
    summary = gpu_report.summary(rows)
    assert summary["race_free_rows_crashed"] == 1 and summary["unmodified_crashed"] == 1
    assert summary["race_free_rows_all_equal"] == 1 and summary["unmodified_all_equal"] == 0
    earlier = {"sglang_version": "0.5.23", "device": "H100", "command": "c", "date": "d",
               "seconds": 1.0, "child_failures": [], "torch": "2.11", "rows": rows}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    for mode in ("unsettled", "unrun", "unshown"):
        kept = _resumed(path, "0.5.23", mode)[0]
        assert [(r["site"]) for r in kept if r["site"] != "a.py:2"] == [], mode
