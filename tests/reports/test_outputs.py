"""Outputs that scale and read well (issue 19, item 7; issue 17, item 2).

Large traces and results gzip-compressed or capped with a note; JUnit with times; SARIF
relative to the repository; the summary only about what ran; reports in the working
directory; a results table in 120 columns that cuts no race; the what-if legend and only the
variants that apply; the necessity legend; wrapped plot titles and a failed run's reason.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from overlap_harness.model.results import CaseResult
from overlap_harness.reports import plot_jobs, writer
from overlap_harness.reports.junit import to_junit
from overlap_harness.reports.perfetto import to_trace, write_trace
from overlap_harness.reports.sarif import to_sarif
from overlap_harness.reports.summary import to_html, to_markdown
from overlap_harness.reports.tables import (
    NECESSITY_LEGEND,
    WHATIF_LEGEND,
    necessity_table,
    results_table,
    variants_for_mode,
    whatif_legend,
)
from overlap_harness.reports.timeline import plot_timeline, wrap_title
from tests.reports.conftest import make_case

REPO = Path(__file__).resolve().parents[2]


def test_a_large_trace_is_gzipped_and_perfetto_json_inside(tmp_path, racy_case) -> None:
    small = write_trace([racy_case], tmp_path / "trace.json")
    assert small == tmp_path / "trace.json"
    big = write_trace([racy_case], tmp_path / "trace.json", gzip_over=1000)
    assert big == tmp_path / "trace.json.gz" and not small.exists()  # no stale twin
    with gzip.open(big, "rt") as f:
        assert json.load(f) == json.loads(json.dumps(to_trace([racy_case])))


def test_a_trace_over_the_cap_keeps_whole_cases_and_says_so(racy_case, base_case) -> None:
    one = len(to_trace([racy_case])["traceEvents"])
    doc = to_trace([racy_case, base_case, racy_case], max_events=one + 1)
    assert len(doc["traceEvents"]) == one
    assert doc["otherData"]["note"].startswith(f"capped at {one + 1} events: the last 2 of 3 ")
    assert "otherData" not in to_trace([racy_case])


def test_large_results_are_gzipped(tmp_path) -> None:
    assert writer.write_text(tmp_path / "r.json", "x" * 10, gzip_over=100).name == "r.json"
    packed = writer.write_text(tmp_path / "r.json", "y" * 200, gzip_over=100)
    assert packed.name == "r.json.gz" and not (tmp_path / "r.json").exists()
    assert gzip.decompress(packed.read_bytes()).decode() == "y" * 200


def test_junit_cases_and_suite_carry_times(racy_case, base_case) -> None:
    racy_case.wall_s, base_case.wall_s = 0.25, 1.5
    root = ET.fromstring(to_junit([racy_case, base_case]))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("time") == "1.750"
    assert [c.get("time") for c in suite.iter("testcase")] == ["0.250", "1.500"]


def _locations(doc: dict) -> list[dict]:
    res = doc["runs"][0]["results"]
    return [loc["physicalLocation"]["artifactLocation"] for r in res
            for loc in r["locations"] + r["relatedLocations"]]


def test_sarif_paths_are_relative_to_the_users_repository(tmp_path, monkeypatch) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "checks").mkdir()
    case = make_case(repo / "checks", mutation="no_publish_wait")
    monkeypatch.chdir(repo / "checks")  # anywhere inside the repository
    doc = to_sarif([case])
    locs = _locations(doc)
    assert {"uri": "checks/synthetic_decode.toml", "uriBaseId": "%SRCROOT%"} in locs
    assert all("file:" not in loc["uri"] and loc["uriBaseId"] for loc in locs)
    assert "%SRCROOT%" in doc["runs"][0]["originalUriBaseIds"]


def test_sarif_outside_any_repository_has_no_absolute_uri(tmp_path, monkeypatch) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    case = make_case(tmp_path / "elsewhere", mutation="no_publish_wait")
    monkeypatch.chdir(tmp_path / "work")
    locs = _locations(to_sarif([case]))
    assert {"uri": "../elsewhere/synthetic_decode.toml", "uriBaseId": "%SRCROOT%"} in locs
    # the protocol's source lines resolve against the harness, wherever it is installed
    assert all(not loc["uri"].startswith(("/", "file:")) for loc in locs)


def test_summary_shows_gpu_rows_only_for_runs_that_ran(tmp_path) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    other = {"run_id": "s99_unrelated/base-00000000", "scenario": "s99_unrelated"}
    mine = {"run_id": case.run_id, "scenario": case.scenario}
    gpu = {"_file": "2026-11-21-h200.json", "runs": [other, mine]}
    md = to_markdown([case], {}, gpu=gpu)
    assert "## Simulated vs GPU (2026-11-21-h200.json, the 1 runs above)" in md
    assert case.run_id in md and "s99_unrelated" not in md
    unrelated = {"_file": "2026-11-21-h200.json", "runs": [other]}
    for doc in (to_markdown([case], {}, gpu=unrelated), to_html([case], {}, gpu=unrelated)):
        assert "Simulated vs GPU" not in doc and "s99_unrelated" not in doc


def test_reports_default_to_a_folder_in_the_working_directory(tmp_path, monkeypatch) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    monkeypatch.chdir(tmp_path)
    html = writer.write_all([case], gpu_dir=None)
    assert html == Path("overlap-reports/summary.html") and html.exists()
    assert "/overlap-reports/" in (REPO / ".gitignore").read_text().splitlines()


def test_plots_drawn_by_workers_match_those_drawn_here(tmp_path, monkeypatch) -> None:
    cases = [dataclasses.replace(make_case(tmp_path, mutation="no_publish_wait"),
                                 run_id=f"synthetic_decode/no_publish_wait-{i}")
             for i in range(3)]
    here = writer.write_plots(cases, tmp_path / "serial")
    monkeypatch.setattr(writer, "PARALLEL_FROM", 2)
    monkeypatch.setattr(writer, "_workers", lambda count: 2)
    forked = writer.write_plots(cases, tmp_path / "forked")
    assert list(here) == list(forked) == [c.run_id for c in cases]
    for run_id in here:
        assert here[run_id].read_bytes() == forked[run_id].read_bytes()


def long_case(tmp_path: Path, index: int) -> CaseResult:
    case = make_case(tmp_path, mutation="no_publish_wait")
    long_races = [dataclasses.replace(r, buffer=f"a_long_buffer_name_{i}")
                  for i, r in enumerate(case.races * 3)]
    return dataclasses.replace(
        case, scenario=f"s{index:02d}_a_scenario_with_a_long_descriptive_name",
        mutation="publish_ready.schedule_wait_and_another_long_label", races=long_races)


def test_results_table_fits_120_columns_and_keeps_every_race(tmp_path) -> None:
    cases = [long_case(tmp_path, i) for i in range(3)]
    text = results_table(cases)
    assert max(len(line) for line in text.splitlines()) <= 120
    for case in cases:
        assert case.scenario in text
        for key in case.race_keys():
            assert key in text  # wrapped onto continuation lines, never cut


def test_whatif_offers_only_variants_that_change_something_and_explains_them() -> None:
    variants = {"ref": {}, "verify_done": {"seq_lens_sync": "verify_done",
                                           "war_barrier": "none"},
                "d2h_on_schedule": {"seq_lens_d2h": "schedule_stream"},
                "read_done": {"war_barrier": "read_done"}, "no_barrier": {"war_barrier": "none"}}
    assert list(variants_for_mode(variants, "non_spec")) == ["ref", "read_done", "no_barrier"]
    assert list(variants_for_mode(variants, "spec_v2")) == list(variants)
    already = variants_for_mode(variants, "spec_v2", {"war_barrier": "read_done"})
    assert "read_done" not in already and "ref" in already
    legend = whatif_legend(["ref", "read_done"]).splitlines()
    assert legend == [f"  ref        {WHATIF_LEGEND['ref']}",
                      f"  read_done  {WHATIF_LEGEND['read_done']}"]


def test_necessity_legend_explains_negative_savings(tmp_path) -> None:
    rows = [["s02", "publish_ready.schedule_wait", "redundant", "-", "no", "-25", "0"]]
    text = necessity_table(rows)
    assert text.endswith(NECESSITY_LEGEND) and "Negative" in NECESSITY_LEGEND
    case = make_case(tmp_path)
    assert NECESSITY_LEGEND in to_markdown([case], {}, rows)


def test_plot_titles_wrap_to_the_figure(tmp_path) -> None:
    case = long_case(tmp_path, 1)
    fig = plot_timeline(case)
    title = fig._suptitle.get_text()
    width_chars = int(fig.get_figwidth() * 72 / (0.6 * 11))
    assert "\n" in title and all(len(line) <= width_chars for line in title.splitlines())
    assert wrap_title("short", 12) == "short"


def test_a_failed_run_plots_its_reason_not_an_empty_axis(tmp_path) -> None:
    case = dataclasses.replace(make_case(tmp_path), timeline=[], races=[], verdict="error",
                               ok=False, error="protocol.stream_aliasing: S aliases F")
    fig = plot_timeline(case)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("run failed: protocol.stream_aliasing: S aliases F" in t for t in texts)
    assert not any(ax.axison for ax in fig.axes)


@pytest.mark.parametrize("name", ["trace.json", "results.json"])
def test_write_all_names_small_outputs_plainly(tmp_path, name) -> None:
    writer.write_all([make_case(tmp_path)], tmp_path / "out", gpu_dir=None)
    assert (tmp_path / "out" / name).exists() and not (tmp_path / "out" / f"{name}.gz").exists()


def test_an_unchanged_plot_is_kept_and_a_changed_one_redrawn(tmp_path, monkeypatch) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    first = writer.write_plots([case], tmp_path / "plots")
    drawn: list[str] = []
    real = plot_jobs.draw_png
    monkeypatch.setattr(plot_jobs, "draw_png", lambda c, p: drawn.append(c.run_id) or real(c, p))
    assert writer.write_plots([case], tmp_path / "plots") == first and drawn == []
    changed = dataclasses.replace(case, races=case.races[:1])
    writer.write_plots([changed], tmp_path / "plots")
    assert drawn == [case.run_id]
