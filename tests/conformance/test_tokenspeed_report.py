"""The committed TokenSpeed report (reports/conformance/tokenspeed-0.1.1.{json,md}, made by
tools/tokenspeed_report.py in a venv with TokenSpeed) agrees with itself on any machine: every
variant race-free as released, the necessity counts add up to sites x variants, every reached
row's verdict matches its races, and the model column recomputed here (no TokenSpeed needed:
the protocol model runs each variant's scenario) equals the committed one, with no
disagreement and a reason on every row it does not model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlap_harness.engines.tokenspeed.model_column import model_row, summary

FOLDER = Path(__file__).resolve().parents[2] / "reports" / "conformance"
JSON, PAGE = FOLDER / "tokenspeed-0.1.1.json", FOLDER / "tokenspeed-0.1.1.md"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(JSON.read_text())


def test_every_variant_is_race_free_as_released(report: dict) -> None:
    assert report["tokenspeed_version"] == "0.1.1"
    assert len(report["variants"]) >= 6
    assert all(v["races"] == 0 and v["ops"] > 0 for v in report["variants"].values())


def test_the_necessity_counts_add_up(report: dict) -> None:
    counts, rows = report["counts"], report["rows"]
    assert sum(counts.values()) == report["sites"] * len(report["variants"])
    assert counts["error"] == 0 and counts["necessary"] > 0
    assert len(rows) == counts["necessary"] + counts["redundant"]
    for row in rows:
        assert row["variant"] in report["variants"] and row["reached"] > 0
        assert (row["verdict"] == "necessary") == bool(row["races"]) == (row["real"] == "race")
        assert row["race_count"] >= len(row["races"])
        assert row["site"].startswith("tokenspeed/runtime/"), row["site"]


def test_the_model_column_is_recomputed_and_agrees(report: dict) -> None:
    for row in report["rows"]:
        again = model_row(row)
        assert (again["model"], again["explanation"]) == (row["model"], row["explanation"]), (
            row["variant"], row["site"])
    counts = summary(report["rows"])
    assert counts == report["model"]
    assert counts["disagreements"] == 0 and counts["modelled"] == counts["reached"]
    for row in report["rows"]:
        if row["model"] == "not_modelled":
            assert row["explanation"].startswith("not modelled: "), row["site"]


def test_the_page_shows_what_the_json_holds(report: dict) -> None:
    page = PAGE.read_text()
    assert f"{report['counts']['necessary']} necessary" in page
    assert f"{report['model']['disagreements']} disagreements" in page
    for name in report["variants"]:
        assert f"| {name} | 0 |" in page
    for row in report["rows"]:
        assert f"| {row['variant']} | {row['site']} |" in page
