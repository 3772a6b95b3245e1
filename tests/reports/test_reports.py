"""Reports: golden text, plots that are not blank, and trace/SARIF/JUnit/HTML structure.

The cases come from real SimDevice runs of a stand-in loop (tests/reports/conftest.py), so
every race drawn or reported here was computed by the detector.
"""

from __future__ import annotations

import itertools
import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np

from overlap_harness.model.results import CaseResult
from overlap_harness.reports.junit import failure_text, to_junit
from overlap_harness.reports.perfetto import to_trace
from overlap_harness.reports.sarif import to_sarif
from overlap_harness.reports.summary import to_html, to_markdown
from overlap_harness.reports.timeline import plot_timeline, save_plot
from overlap_harness.reports.writer import write_all
from tests.reports.conftest import make_case


def test_race_report_golden(racy_case: CaseResult) -> None:
    first = racy_case.races[0]
    assert first.describe() == textwrap.dedent("""\
        RAW race on new_seq_lens_buf[0:2] (manifest)
          first:  verify (iteration 0) on forward writing new_seq_lens_buf at tests/reports/conftest.py:59
          second: gather_seq_lens (iteration 1) on schedule reading new_seq_lens_buf at tests/reports/conftest.py:53""")  # noqa: E501


def test_junit_failure_text_golden(racy_case: CaseResult) -> None:
    racy_case.ok, racy_case.expect = False, "race_free"
    text = failure_text(racy_case)
    assert text.splitlines()[0] == "expected race_free, detector computed race"
    assert text.count("RAW race on new_seq_lens_buf") == len(racy_case.races) == 2


def test_junit_has_one_case_per_run_and_failures_carry_the_report(tmp_path: Path) -> None:
    ok = make_case(tmp_path)
    bad = make_case(tmp_path, mutation="no_publish_wait")
    bad.ok, bad.expect = False, "race_free"
    root = ET.fromstring(to_junit([ok, bad]).split("\n", 1)[1])
    suite = root.find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["base", "no_publish_wait"]
    assert cases[0].find("failure") is None
    assert "RAW race on new_seq_lens_buf" in cases[1].find("failure").text


def _pixels(path: Path) -> np.ndarray:
    img = mpimg.imread(path)
    return img[..., :3]


def test_timeline_png_is_sized_not_blank_and_draws_the_race_in_red(tmp_path, racy_case):
    base = make_case(tmp_path)
    png_racy = save_plot(plot_timeline(racy_case), tmp_path / "racy")[0]
    png_base = save_plot(plot_timeline(base), tmp_path / "base")[0]
    for png in (png_racy, png_base):
        px = _pixels(png)
        assert px.shape[0] >= 300 and px.shape[1] >= 800
        assert px.std() > 0.05  # not blank
    def red(px: np.ndarray) -> int:
        return int(((px[..., 0] > 0.75) & (px[..., 1] < 0.3) & (px[..., 2] < 0.3)).sum())
    assert red(_pixels(png_racy)) > red(_pixels(png_base)) + 50
    assert (tmp_path / "racy.svg").read_text().startswith("<?xml")


def test_a_16_iteration_plot_and_a_window(tmp_path: Path) -> None:
    case = make_case(tmp_path, iterations=16, mutation="no_publish_wait")
    full = _pixels(save_plot(plot_timeline(case), tmp_path / "full")[0])
    zoom = _pixels(save_plot(plot_timeline(case, window=(3, 5)), tmp_path / "zoom")[0])
    assert full.std() > 0.05 and zoom.std() > 0.05
    assert not np.array_equal(full.shape, zoom.shape) or not np.allclose(full, zoom)


def test_perfetto_trace_follows_the_format(racy_case: CaseResult) -> None:
    doc = json.loads(json.dumps(to_trace([racy_case])))
    ev = doc["traceEvents"]
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"host", "schedule", "forward", "d2h"} <= threads
    slices = [e for e in ev if e["ph"] == "X"]
    assert {"verify", "gather_seq_lens", "embed"} <= {e["name"] for e in slices}
    for e in slices:
        assert {"name", "ts", "dur", "pid", "tid"} <= e.keys() and e["dur"] > 0
    per_track: dict[tuple, list] = {}
    for e in slices:  # slices on one track nest or follow each other, never cross
        per_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_track.values():
        spans.sort(key=lambda span: (span[0], -span[1]))  # of two that start together, the
        # longer first: the shorter nests in it
        for (_a0, a1), (b0, b1) in itertools.pairwise(spans):
            assert b0 >= a1 - 1e-6 or b1 <= a1 + 1e-6
    starts = {e["id"]: e for e in ev if e["ph"] == "s"}
    ends = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert starts.keys() == ends.keys() and starts
    race_flows = [e for e in starts.values() if e["cat"] == "race"]
    assert len(race_flows) == len(racy_case.races)
    assert all(ends[e["id"]]["ts"] >= e["ts"] for e in race_flows)  # forward in time
    assert any(e["cat"] == "event" for e in starts.values())  # record -> wait arrows


def test_sarif_has_a_rule_per_kind_and_results_at_the_scenario(racy_case: CaseResult) -> None:
    doc = to_sarif([racy_case])
    assert doc["version"] == "2.1.0" and doc["$schema"].endswith("sarif-2.1.0.json")
    run = doc["runs"][0]
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} == {
        "RAW", "WAR", "WAW", "host-D2H", "reuse"}
    (res, *_) = run["results"]
    assert res["ruleId"] == "RAW"
    loc = res["locations"][0]["physicalLocation"]
    # tmp_path is outside the repository: a relative path from %SRCROOT%, never file://
    assert loc["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
    assert loc["artifactLocation"]["uri"].endswith("/synthetic_decode.toml")
    assert not loc["artifactLocation"]["uri"].startswith(("file:", "/"))
    text = Path(racy_case.path).read_text().splitlines()
    assert "publish_ready.schedule_wait" in text[loc["region"]["startLine"] - 1]
    related = res["relatedLocations"]
    assert {"uri": "tests/reports/conftest.py", "uriBaseId": "%SRCROOT%"} in [
        r["physicalLocation"]["artifactLocation"] for r in related]
    assert any("removed sync" in r["message"]["text"] for r in related)


def test_summary_names_each_case_and_race(tmp_path: Path) -> None:
    cases = [make_case(tmp_path), make_case(tmp_path, mutation="no_publish_wait")]
    md = to_markdown(cases, {})
    html = to_html(cases, {})
    for doc in (md, html):
        assert "synthetic_decode" in doc and "no_publish_wait" in doc
        assert "RAW race on new_seq_lens_buf" in doc
    assert "2 passed, 0 failed" in md


def test_write_all_writes_every_report(tmp_path: Path) -> None:
    cases = [make_case(tmp_path), make_case(tmp_path, mutation="no_publish_wait")]
    out = tmp_path / "out"
    html = write_all(cases, out, gpu_dir=None)
    names = {p.name for p in out.iterdir()}
    assert {"summary.html", "summary.md", "trace.json", "junit.xml", "results.sarif",
            "results.json", "plots", "scenarios"} <= names
    assert len(list((out / "plots").glob("*.png"))) == 1  # the racy case only
    assert "data:image/png;base64," in html.read_text()


def test_a_measured_timeline_is_drawn_under_the_simulated_one(tmp_path: Path) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    measured = make_case(tmp_path, iterations=3).timeline  # stands in for a GPU timeline
    fig = plot_timeline(case, gpu=measured)
    axes = [ax for ax in fig.axes if ax.get_yticklabels()]
    assert len(axes) == 2 and axes[0].get_xlim() == axes[1].get_xlim()
    png = _pixels(save_plot(fig, tmp_path / "both")[0])
    single = _pixels(save_plot(plot_timeline(case), tmp_path / "one")[0])
    assert png.shape[0] > single.shape[0]
