"""The newest committed GPU report of the recorder corpus (reports/recorder/*.json, written by
tools/recorder_gpu_report.py on a CUDA machine) is consistent, checked on the CPU:

- it says where, when and how it ran, and its Markdown twin lies beside it;
- every pair of corpus.toml is there, racy and fixed, with the manifest's predictions;
- each row's flags follow from its own figures, and the totals are the rows' sums
  (recounted here, not by the tool's code);
- the recorder's CPU-mode verdict on every program (kind, tensor, both lines) equals what the
  recorder computes now, so a report stays valid only while the code gives its verdicts.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.recorder_corpus.manifest import load_manifest
from tests.recorder_corpus.verdicts import watch_program

ROOT = Path(__file__).resolve().parent.parent.parent
REPORTS = sorted((ROOT / "reports" / "recorder").glob("*.json"))
PAIRS = [pair for pair in load_manifest() if not pair.gpu_pending]
PENDING = [pair.name for pair in load_manifest() if pair.gpu_pending]

pytestmark = pytest.mark.skipif(
    not REPORTS, reason="no GPU report committed yet: run tools/recorder_gpu_report.py on a "
                        "CUDA machine and commit reports/recorder/<date>-<device>.json and .md")


def _newest() -> Path:
    """The report with the latest date (file names break ties)."""
    return max(REPORTS, key=lambda p: (json.loads(p.read_text(encoding="utf-8"))["date"], p.name))


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return json.loads(_newest().read_text(encoding="utf-8"))


def _rows(report: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["pair"], r["twin"]): r for r in report["programs"]}


def test_where_when_and_how_it_ran(report: dict[str, Any]) -> None:
    assert report["device"] and report["torch"] and report["driver"]
    assert dt.datetime.fromisoformat(report["date"]).year >= 2025
    assert "tools/recorder_gpu_report.py" in report["command"]
    assert report["trials"] >= 1
    markdown = _newest().with_suffix(".md")
    assert markdown.is_file()
    text = markdown.read_text(encoding="utf-8")
    assert all(f"| {pair.name} (racy)" in text and f"| {pair.name} (fixed)" in text
               for pair in PAIRS)


def test_every_pair_is_there_with_the_manifest_predictions(report: dict[str, Any]) -> None:
    rows = _rows(report)
    assert set(rows) == {(p.name, twin) for p in PAIRS for twin in ("racy", "fixed")}
    assert len(report["programs"]) == len(rows)
    for pair in PAIRS:
        predicted = [{"kind": r.kind, "tensor": r.tensor, "sites": list(r.sites)}
                     for r in pair.races]
        assert rows[(pair.name, "racy")]["predicted"] == predicted
        assert rows[(pair.name, "fixed")]["predicted"] == []
        assert rows[(pair.name, "racy")]["file"] == str(pair.racy_path.relative_to(ROOT))


def test_pairs_marked_pending_are_not_in_the_report_yet(report: dict[str, Any]) -> None:
    covered = {pair for pair, _twin in _rows(report)}
    assert not covered & set(PENDING), "the report covers them: drop their gpu_pending mark"


def test_row_flags_follow_from_the_rows_figures(report: dict[str, Any]) -> None:
    trials = report["trials"]
    for row in report["programs"]:
        values = row["values"]
        if values is None or values["incomplete"]:
            assert row["forced_manifestation_ok"] is None
        elif row["twin"] == "racy":
            assert row["forced_manifestation_ok"] == (values["delayed_wrong"] == trials)
        else:
            assert row["forced_manifestation_ok"] == (
                values["delayed_wrong"] == 0 and values["plain_wrong"] == 0)
        if values is not None:
            assert 0 <= values["delayed_wrong"] <= trials and 0 <= values["plain_wrong"] <= trials
        cpu, gpu = row["recorder_cpu"], row["recorder_gpu"]
        if "keys" in cpu and "keys" in gpu:
            assert row["cpu_gpu_agree"] == (cpu["keys"] == gpu["keys"])
        for side in (cpu, gpu):
            if side["verdict"] in ("race", "race_free"):
                assert (side["verdict"] == "race") == bool(side["races"])
                assert len(side["keys"]) <= len(side["races"])
                assert bool(side["keys"]) == bool(side["races"])


def test_totals_are_the_sums_of_the_rows(report: dict[str, Any]) -> None:
    racy = [r for r in report["programs"] if r["twin"] == "racy"]
    fixed = [r for r in report["programs"] if r["twin"] == "fixed"]
    every = racy + fixed
    expected = {
        "pairs": len(PAIRS),
        "racy_wrong_in_every_delayed_trial": sum(r["forced_manifestation_ok"] is True
                                                 for r in racy),
        "fixed_never_wrong": sum(r["forced_manifestation_ok"] is True for r in fixed),
        "recorder_cpu_right": sum(r["recorder_cpu"]["meets_manifest"] is True for r in every),
        "recorder_gpu_right": sum(r["recorder_gpu"]["meets_manifest"] is True for r in every),
        "cpu_gpu_agree": sum(r["cpu_gpu_agree"] is True for r in every),
        "csan_racy_flagged": sum(bool(r["csan"] and r["csan"]["flagged"]) for r in racy),
        "csan_fixed_flagged": sum(bool(r["csan"] and r["csan"]["flagged"]) for r in fixed),
    }
    assert report["sums"] == expected


@pytest.mark.skipif(importlib.util.find_spec("recorder") is None,
                    reason="the recorder package (issue 15) is not in this tree yet")
def test_cpu_verdicts_are_what_the_recorder_computes_now(report: dict[str, Any]) -> None:
    differences = []
    for row in report["programs"]:
        path = ROOT / row["file"]
        _run, races = watch_program(path, "cpu")
        now = [list(key) for key in sorted({r.key() for r in races})]
        if row["recorder_cpu"].get("keys") != now:
            differences.append(f"{path.name}: report {row['recorder_cpu'].get('keys')}, now {now}")
    assert differences == []
