"""The committed predicted-vs-measured reports (``reports/gpu/calibration/*-vs-*.json``,
written by ``overlap-harness calibrate --compare`` from a GPU report and a profile) state
numbers consistent with their rows, and their rows with the GPU report they name.

Skips, with the reason, while none is committed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from overlap_harness.model.profile import load_profile
from overlap_harness.profile_check import METRICS, rel_err, summarize, summary_line

ROOT = Path(__file__).resolve().parents[2]
#: A folder of its own, so the suite reports these runs made (fewer trials, no sanitizer)
#: are not taken for the newest full suite report by tests/gpu_check/test_suite_report.py.
FOLDER = ROOT / "reports" / "gpu" / "calibration"
REPORTS = sorted(p for p in FOLDER.glob("*-vs-*.json")
                 if json.loads(p.read_text(encoding="utf-8")).get("kind") == "profile-check")

pytestmark = pytest.mark.skipif(not REPORTS, reason="no predicted-vs-measured GPU report is "
                                "committed under reports/gpu/calibration/ yet (calibrate "
                                "--compare)")


@pytest.fixture(params=REPORTS, ids=[p.name for p in REPORTS])
def doc(request):
    return request.param, json.loads(request.param.read_text(encoding="utf-8"))


def test_rows_errors_are_their_numbers(doc):
    _, d = doc
    assert d["rows"]
    for r in d["rows"]:
        for k in METRICS:
            m = r["metrics"][k]
            assert m["rel_err"] == rel_err(m["predicted"], m["measured"])


def test_summary_is_recomputed_from_rows(doc):
    _, d = doc
    assert d["summary"] == summarize(d["rows"])
    for k in METRICS:
        errs = [abs(r["metrics"][k]["rel_err"]) for r in d["rows"]
                if r["metrics"][k]["rel_err"] is not None]
        assert d["summary"][k]["median_abs_rel_err"] == round(statistics.median(errs), 4)
        assert d["summary"][k]["runs"] == len(errs)


def test_page_states_the_summary_and_every_row(doc):
    path, d = doc
    page = path.with_suffix(".md").read_text(encoding="utf-8")
    assert f"**{summary_line(d['summary'])}**" in page
    for r in d["rows"]:
        assert f"| {r['run_id']} | {r['kind']} |" in page
    assert path.with_name(d["plot"]).is_file()


def test_measured_values_are_the_gpu_reports(doc):
    path, d = doc
    gpu = json.loads((path.parent / d["report"]).read_text(encoding="utf-8"))
    measured = {r["run_id"]: r["timing"] for r in gpu["runs"] if r.get("timing")}
    assert sorted(measured) == sorted(r["run_id"] for r in d["rows"])
    for r in d["rows"]:
        for k in METRICS:
            assert r["metrics"][k]["measured"] == measured[r["run_id"]][k]["gpu"]
            assert r["metrics"][k]["before"] == measured[r["run_id"]][k]["sim"]


def test_profile_named_is_committed_and_valid(doc):
    _, d = doc
    profile = load_profile(ROOT / "profiles" / d["profile"])
    assert profile.device == d["profile_device"]
