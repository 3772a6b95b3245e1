"""reports/gpu/semantics-*.json, written by a GPU run of gpu_check/semantics_check.py, is
consistent: where and when it ran, every trace present, our verdicts as expected (disjoint rows
race-free, the early pinned read a manifest host-D2H race), and in every trace the detector's
manifest flag agrees with the values the run observed. Runs on CPU: the report is committed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from overlap_harness.gpu_check.traces import TRACES

ROOT = Path(__file__).resolve().parent.parent.parent
REPORTS = sorted((ROOT / "reports" / "gpu").glob("semantics-*.json"))


def test_a_report_is_committed() -> None:
    assert REPORTS, "no reports/gpu/semantics-*.json"


@pytest.fixture(scope="module", params=REPORTS, ids=lambda p: p.name)
def report(request) -> dict:
    return json.loads(request.param.read_text(encoding="utf-8"))


def rows(report: dict) -> dict[str, dict]:
    return {r["name"]: r for r in report["traces"]}


def test_where_and_when_it_ran(report: dict) -> None:
    assert report["device"] and report["driver"] and report["torch"]
    assert dt.datetime.fromisoformat(report["date"]).year >= 2025
    assert report["calibration"]["cycles_per_us"] > 0
    assert "semantics_check.py" in report["command"]


def test_every_trace_is_there_with_its_expectation(report: dict) -> None:
    got = rows(report)
    assert set(got) == {t.name for t in TRACES}
    for t in TRACES:
        assert got[t.name]["expect"] == list(t.expect)


def test_our_verdicts_are_the_expected_ones(report: dict) -> None:
    for name, r in rows(report).items():
        ours = r["ours"]
        assert ours["kinds"] == r["expect"], name
        assert ours["verdict"] == ("race" if r["expect"] else "race_free"), name
        assert [x["kind"] for x in ours["races"]] == ours["kinds"], name


def test_disjoint_rows_race_free_and_early_pinned_read_a_manifest_race(report: dict) -> None:
    got = rows(report)
    assert got["disjoint_rows"]["ours"]["verdict"] == "race_free"
    early = got["pinned_early_read"]["ours"]
    assert early["kinds"] == ["host-D2H"] and early["races"][0]["manifest"] is True
    assert early["values"]["pin"] != got["pinned_early_read"]["ordered"]["pin"]


def test_manifest_flag_agrees_with_the_observed_values(report: dict) -> None:
    for name, r in rows(report).items():
        ours = r["ours"]
        differ = any(ours["values"].get(k) != v for k, v in r["ordered"].items())
        manifest = any(x["manifest"] for x in ours["races"])
        assert ours["manifest"] == manifest, name
        assert ours["values_differ_from_ordered"] == differ, name
        assert manifest == differ, (name, ours["values"], r["ordered"])


def test_csan_verdicts_are_recorded_for_the_comparison(report: dict) -> None:
    got = rows(report)
    assert all(r["csan"]["verdict"] in ("race", "race_free", "error") for r in got.values())
    assert got["disjoint_rows"]["csan"]["verdict"] == "race"  # CSAN: whole-tensor granularity
    assert got["pinned_early_read"]["csan"]["verdict"] == "race_free"  # CSAN: no host accesses
