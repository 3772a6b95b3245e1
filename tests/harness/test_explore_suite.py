"""Exploration finds and shrinks a manifest schedule for every racy run of the suite."""

from __future__ import annotations

from pathlib import Path

from overlap_harness.runner import explore_specs
from overlap_harness.scenarios.loader import load_paths

SUITE = Path(__file__).resolve().parents[2] / "scenarios"


def test_every_racy_run_is_made_manifest_and_shrunk() -> None:
    rows, failed = explore_specs(load_paths([SUITE]), budget=16)
    assert failed == 0, [r for r in rows if r[2] != "yes"]
    assert len(rows) >= 30  # one row per run the detector found racy
    for run, _races, manifest, source, tried, shrunk in rows:
        assert manifest == "yes" and int(tried) >= 1, run
        if source != "baseline":  # a found schedule is shrunk to a single delay here
            assert shrunk.count("+") == 1, (run, shrunk)
