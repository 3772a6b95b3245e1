"""Names of any length: report file names stay within the file system's limit and distinct,
and a timeline keeps its axes however long its title and lane names are."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from overlap_harness.model.results import CaseResult
from overlap_harness.reports import writer
from overlap_harness.reports.file_names import MAX_STEM, safe_name
from overlap_harness.reports.timeline import (
    MAX_LANE_LABEL,
    MAX_TITLE_LINES,
    plot_timeline,
    save_plot,
)
from tests.reports.conftest import make_case


def test_a_short_name_keeps_its_look() -> None:
    assert safe_name("s02_schedule/publish_ready.schedule_wait-5a98ed72") == \
        "s02_schedule_publish_ready.schedule_wait-5a98ed72"
    assert safe_name("..") == "__"


def test_long_names_are_bounded_and_stay_distinct() -> None:
    one, two = "a" * 299 + "1", "a" * 299 + "2"
    assert len(safe_name(one)) == len(safe_name(two)) == MAX_STEM
    assert safe_name(one) != safe_name(two)
    assert safe_name(one).startswith("a" * 100)
    assert safe_name(one) == safe_name(one)  # the same name, the same file, run after run


def _renamed(case: CaseResult, name: str) -> CaseResult:
    return dataclasses.replace(case, scenario=name, run_id=f"{name}/{case.run_id.split('/')[-1]}")


@pytest.mark.parametrize("length", [300, 2000])
def test_every_report_of_a_run_with_a_long_name_is_written(tmp_path: Path, length: int) -> None:
    case = _renamed(make_case(tmp_path, mutation="no_publish_wait"), "n" * length)
    html = writer.write_all([case], tmp_path / "out", gpu_dir=None)
    assert html.is_file()
    (png,) = (tmp_path / "out" / "plots").glob("*.png")
    assert len(png.name) <= MAX_STEM + len(".png")
    assert case.config  # so its scenario file is written too, under a bounded name
    (config,) = (tmp_path / "out" / "scenarios").glob("*.json")
    assert len(config.stem) <= MAX_STEM


def test_a_timeline_keeps_its_axes_with_any_title_or_lane_name(tmp_path: Path) -> None:
    case = _renamed(make_case(tmp_path, mutation="no_publish_wait"), "t" * 2000)
    lane = case.timeline[0].agent
    timeline = [dataclasses.replace(t, agent="s" * 500) if t.agent == lane else t
                for t in case.timeline]
    fig = plot_timeline(dataclasses.replace(case, timeline=timeline))
    title = fig._suptitle.get_text()
    assert len(title.splitlines()) <= MAX_TITLE_LINES and "race" in title  # verdict kept
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert max(map(len, labels)) == MAX_LANE_LABEL
    box = fig.axes[0].get_position()
    assert box.width > 0.2 and box.height > 0.2
    (png,) = save_plot(fig, tmp_path / "long", formats=("png",))
    assert png.stat().st_size > 0
