"""The newest committed GPU suite report (reports/gpu/<date>-<device>.json, written by
``overlap-harness gpu-check``) covers the current suite and agrees with the model.

Runs on CPU: the report is committed, the simulator's verdicts are recomputed here. It fails
when the suite has runs the report lacks (the report is stale: run gpu-check again), when a
race-free run's values differed from the simulator's or the oracle's in any trial, when a
racy run showed the predicted values in fewer than 95% of its trials (or its schedule changes
no value: every predicted race must show as a wrong value), when a sim verdict in
the report is not what the simulator computes now, or when the figures do not add up.

Race-free runs whose simulated values are device-defined (a read of never-written memory:
allocator-dependent; a scatter writing an element twice: scatter-order-dependent) are held to
no agreement: which ones they are is recomputed here on CPU, not taken from the report.

Racy runs are held to the 95% target under their class, recomputed here too by simulating the
report's schedule (its delays) at its launch cost: ``exact`` runs count the trials with exactly
the predicted values; manifest-only runs (the delayed prediction reads never-written memory,
scatters an element twice, or has a reuse race) count the trials whose wrong values are at
exactly the predicted places (``same_keys``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from overlap_harness.replay.plan import (
    DETERMINISTIC,
    EXACT,
    device_defined,
    diffs,
    oracle_run,
    run_class,
    sim_run,
    values_class,
    with_launch,
)
from overlap_harness.replay.report import MATCH_TARGET, at_target, hits, parse_delays, summarize
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths

ROOT = Path(__file__).resolve().parents[2]
GPU_REPORTS = ROOT / "reports" / "gpu"


def newest_suite_report() -> Path | None:
    """The suite report with the latest date (other GPU reports have other kinds)."""
    found = []
    for p in GPU_REPORTS.glob("*.json"):
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("kind") == "gpu-suite":
            found.append((data["date"], p.name, p))
    return max(found)[2] if found else None


REPORT = newest_suite_report()
pytestmark = pytest.mark.skipif(
    REPORT is None, reason="no GPU suite report committed yet: reports/gpu/<date>-<device>.json "
    "is written by `overlap-harness gpu-check scenarios` on a CUDA machine")


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    assert REPORT is not None
    return json.loads(REPORT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in report["runs"]}


@pytest.fixture(scope="module")
def specs() -> list[RunSpec]:
    return [s for sc in load_paths([ROOT / "scenarios"]) for s in expand(sc)]


def test_where_when_and_how_it_ran(report: dict[str, Any]) -> None:
    assert report["device"] and report["driver"] and report["torch"]
    assert dt.datetime.fromisoformat(report["date"]).year >= 2025
    assert "gpu-check" in report["command"] and report["trials"] >= 1
    assert report["host_launch_us"] > 0 and report["calibration"]["cycles_per_us"] > 0
    assert (GPU_REPORTS / REPORT.with_suffix(".md").name).is_file()


def test_the_report_covers_every_run_of_the_suite(specs: list[RunSpec],
                                                  rows: dict[str, dict[str, Any]],
                                                  report: dict[str, Any]) -> None:
    """Every run of the suite is in the report: replayed, or named by the report itself as
    not replayed (``gpu-check --deadline`` ran out; the README says which). A run the report
    does not know is a run added since: the report is stale."""
    skipped = set(report.get("not_replayed", []))
    missing = [s.run_id for s in specs if s.run_id not in rows and s.run_id not in skipped]
    assert not missing, f"{len(missing)} runs of scenarios/ are not in {REPORT.name} (stale " \
        f"report: rerun `overlap-harness gpu-check scenarios`): {missing[:8]}"
    assert not skipped & set(rows), "a run both replayed and listed as not replayed"


@pytest.fixture(scope="module")
def classes(report: dict[str, Any], specs: list[RunSpec]) -> dict[str, str]:
    """Each run's values class, recomputed: the undelayed simulation at the report's launch
    cost, as the GPU run planned it."""
    out = {}
    for spec in specs:
        try:
            uninit, dup = device_defined(with_launch(spec.scenario, spec,
                                                     report["host_launch_us"]), spec.removed)
        except Exception:  # the harness refuses the run: no values
            continue
        out[spec.run_id] = values_class(uninit, dup)
    return out


def test_values_classes_are_what_the_simulator_computes_now(
        classes: dict[str, str], rows: dict[str, dict[str, Any]]) -> None:
    differ = {rid: (r.get("values_class"), classes[rid]) for rid, r in rows.items()
              if r["kind"] != "error" and rid in classes
              and r.get("values_class") != classes[rid]}
    assert not differ, differ


def test_race_free_runs_agree_in_every_trial(report: dict[str, Any],
                                             rows: dict[str, dict[str, Any]],
                                             classes: dict[str, str]) -> None:
    bad = {}
    for rid, r in rows.items():
        if r["kind"] != "race_free" or classes.get(rid, DETERMINISTIC) != DETERMINISTIC:
            continue
        m = r["main"]
        ok = m["trials"] == report["trials"] and m["equal"] == m["equal_oracle"] == m["trials"]
        if not (ok and r["agreement"]):
            bad[rid] = (m["equal"], m["equal_oracle"], m["trials"], m["first_mismatch"][:1],
                        m["errors"][:1])
    assert not bad, bad


@pytest.fixture(scope="module")
def racy_predictions(report: dict[str, Any], specs: list[RunSpec],
                     rows: dict[str, dict[str, Any]]) -> dict[str, tuple[str, list[str]]]:
    """Each racy run's class and wrong values (its differences from the serial oracle),
    recomputed: the simulation under the report's schedule at the report's launch cost, as
    the GPU run was planned and predicted."""
    out = {}
    for spec in specs:
        row = rows.get(spec.run_id)
        if row is None or row["kind"] != "racy":
            continue
        sc = with_launch(spec.scenario, spec, report["host_launch_us"])
        view, run = sim_run(sc, spec.removed, parse_delays(row["schedule"]["delays_us"]))
        out[spec.run_id] = (run_class(run), diffs(view.values, oracle_run(sc, spec.removed)))
    return out


@pytest.fixture(scope="module")
def racy_classes(racy_predictions: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """Each racy run's class, recomputed (:func:`racy_predictions`)."""
    return {rid: cls for rid, (cls, _diffs) in racy_predictions.items()}


def test_racy_classes_are_what_the_simulator_computes_now(
        racy_classes: dict[str, str], rows: dict[str, dict[str, Any]]) -> None:
    differ = {rid: (rows[rid].get("match_class"), cls) for rid, cls in racy_classes.items()
              if rows[rid].get("match_class") != cls}
    assert not differ, differ


def test_racy_runs_show_the_predicted_values(report: dict[str, Any],
                                             rows: dict[str, dict[str, Any]],
                                             racy_classes: dict[str, str]) -> None:
    """Exact runs: the predicted values in 95% of the trials; manifest-only runs (class
    recomputed above, not the report's): wrong values at the predicted places in 95%."""
    bad = {}
    for rid, r in rows.items():
        if r["kind"] != "racy":
            continue
        m = r["main"]
        cls = racy_classes.get(rid, EXACT)
        if m["trials"] != report["trials"] or not at_target(r, cls):
            bad[rid] = (cls, hits(r, cls), m["trials"], m["first_mismatch"][:1],
                        m["errors"][:1])
        # equal values: equal diffs, at equal places
        assert r["match"] == m["equal"] <= m["same_diffs"] <= m["same_keys"], rid
        if r["predicted_diffs"]:  # a trial with the predicted values shows wrong values
            assert m["manifest"] >= r["match"], rid
        assert r["baseline"]["trials"] == report["baseline_trials"], rid
    assert not bad, bad


def test_every_racy_run_changes_a_value_and_the_gpu_showed_it(
        racy_predictions: dict[str, tuple[str, list[str]]],
        rows: dict[str, dict[str, Any]]) -> None:
    """Every predicted race manifests as a value: the simulation under the report's schedule
    (recomputed, :func:`racy_predictions`) differs from the serial oracle, exactly as the
    report's ``predicted_diffs`` say, and the GPU showed wrong values in 95% of the gated
    trials."""
    bad = {}
    for rid, (_cls, now) in racy_predictions.items():
        row = rows[rid]
        m = row["main"]
        if not now or now != row["predicted_diffs"] or m["manifest"] < MATCH_TARGET * m["trials"]:
            bad[rid] = (len(now), len(row["predicted_diffs"]), m["manifest"], m["trials"])
    assert not bad, bad


def test_the_detector_on_the_gpu_trace_agrees_with_the_sim(
        rows: dict[str, dict[str, Any]]) -> None:
    bad = {rid: (r["sim_verdict"], r["gpu_verdicts"]) for rid, r in rows.items()
           if set(r["gpu_verdicts"]) != {r["sim_verdict"]}}
    assert not bad, bad


def test_sim_verdicts_are_what_the_simulator_computes_now(
        specs: list[RunSpec], rows: dict[str, dict[str, Any]]) -> None:
    from overlap_harness.runner import run_spec

    differ = {}
    for spec in specs:
        row = rows.get(spec.run_id)
        if row is None:
            continue  # reported by the coverage test
        now = run_spec(dataclasses.replace(spec)).verdict
        kind = {"race": "racy", "error": "error"}.get(now, "race_free")
        if (row["sim_verdict"], row["kind"]) != (now, kind):
            differ[spec.run_id] = (row["sim_verdict"], row["kind"], now)
    assert not differ, differ


def test_the_summary_adds_up(report: dict[str, Any]) -> None:
    assert report["summary"] == summarize(report["runs"])
    s = report["summary"]
    assert s["runs"] == s["race_free_runs"] + s["racy_runs"] + s["error_runs"]
    assert s["race_free_agreement_pct"] == 100.0
