"""A timeline plot a reader can take in: race connectors and their labels inside the axes
(an access outside the plotted window is drawn at its edge, marked hollow), a legend entry
for every mark drawn, a title without an expected verdict for a run that has none (a user's
program or engine tree), and a title that sums up a hundred races instead of listing them.
Measured on the drawn figure (matplotlib's own extents), never on the code's intentions."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from overlap_harness.reports.lanes import lane_order
from overlap_harness.reports.race_arrow import RACE_COLOR, RaceArrow
from overlap_harness.reports.race_connectors import draw_races
from overlap_harness.reports.timeline import _Lanes, agg_figure, case_title, plot_timeline
from tests.reports.conftest import make_case


def _inside(inner, outer, slack: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y0 >= outer.y0 - slack and inner.y1 <= outer.y1 + slack)


def test_connectors_and_labels_stay_inside_the_axes(tmp_path: Path) -> None:
    """A window that cuts two of the three races in half (each one's other access lies
    before or after it): drawn as the timeline draws them, every connector and label lies
    inside the axes and the accesses outside sit hollow at its edges."""
    case = make_case(tmp_path, iterations=4, mutation="no_publish_wait")
    span = (3_000_000, 5_000_000)  # ns: races' accesses at 2.59, 3.79, 4.59 and 5.79 ms
    fig = agg_figure(12.0, 3.0)
    ax = fig.subplots()
    lanes = _Lanes(lane_order(case.timeline))
    ax.set_xlim(span[0] / 1e3, span[1] / 1e3)
    ax.set_ylim(-0.7, len(lanes.names) - 0.2)
    fig.subplots_adjust(left=0.1, right=0.95)
    drawn, arrows = draw_races(ax, case.races, case.timeline, lanes, span,
                               12.0 * 0.85 * fig.dpi / (span[1] - span[0]))
    assert (drawn, arrows) == (2, 2)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    connectors = [a for a in ax.patches + ax.artists if isinstance(a, RaceArrow)]
    assert len(connectors) == 2
    for arrow in connectors:  # slack: the head's width and the line's
        assert _inside(arrow.get_path().transformed(arrow.get_transform()).get_extents(), box,
                       slack=12)
    labels = [t for t in ax.texts if to_hex(t.get_color()) == RACE_COLOR]
    assert labels and all(_inside(t.get_window_extent(renderer), box) for t in labels)
    [hollow] = [line for line in ax.lines if line.get_marker() == "o"
                and to_hex(line.get_markerfacecolor()) == "#ffffff"]
    assert sorted(hollow.get_xdata()) == [span[0] / 1e3, span[1] / 1e3]


def test_every_mark_drawn_has_a_legend_entry(tmp_path: Path) -> None:
    case = make_case(tmp_path, iterations=4, mutation="no_publish_wait")
    fig = plot_timeline(case, window=(2, 2))
    ax = fig.axes[0]
    handles = fig.legends[0].legend_handles
    legend_marks = {(h.get_marker(), to_hex(h.get_color()), to_hex(h.get_markerfacecolor()))
                    for h in handles if isinstance(h, Line2D)}
    drawn = {(line.get_marker(), to_hex(line.get_color()), to_hex(line.get_markerfacecolor()))
             for line in ax.lines if line.get_marker() not in (None, "None", "")}
    assert drawn and drawn <= legend_marks
    faces = {to_hex(h.get_facecolor()) for h in handles if isinstance(h, Patch)}
    bars = {to_hex(c) for collection in ax.collections if type(collection).__name__ ==
            "PolyCollection" for c in collection.get_facecolors()}
    assert bars and bars <= faces
    assert not any("(?)" in t.get_text() for t in ax.texts)  # untimed races say no state


def test_a_run_without_an_expectation_has_no_expected_verdict_in_its_title(
        tmp_path: Path) -> None:
    case = make_case(tmp_path, iterations=3, mutation="no_publish_wait")
    title = case_title(dataclasses.replace(case, expect="", ok=False))
    assert title.endswith(" \u2014 race (2 races: RAW new_seq_lens_buf)")
    assert "expected" not in title and "FAIL" not in title
    scenario = case_title(dataclasses.replace(case, expect="race_free", ok=False))
    assert scenario.endswith("; FAIL, expected race_free)")


def test_a_hundred_races_are_summed_up_in_the_title(tmp_path: Path) -> None:
    case = make_case(tmp_path, iterations=3, mutation="no_publish_wait")
    race = case.races[0]
    races = [dataclasses.replace(race, buffer=f"buffer_{i % 40}") for i in range(120)]
    races += [dataclasses.replace(race, buffer="reused", kind=type(race.kind)("reuse"))]
    title = case_title(dataclasses.replace(case, races=races, expect=""))
    assert title.endswith(" \u2014 race (121 races, 41 distinct: 40 RAW, 1 reuse)")
