"""A timeline plot's race connectors: one per race, or one per pair of sites past
:data:`overlap_harness.reports.race_sites.MAX_SINGLE_RACES` races in view, each labelled
where its label does not cover the previous one. Split from
:mod:`overlap_harness.reports.timeline` (which draws the lanes, ops and arrows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.axes import Axes

from overlap_harness.model.trace import Access, OpRecord, Race, describe_elements
from overlap_harness.reports.race_arrow import RACE_COLOR, RaceArrow
from overlap_harness.reports.race_sites import plotted_groups

MAX_RACES_DRAWN = 200
"""Connectors drawn at most (each a race, or a pair of sites past MAX_SINGLE_RACES)."""


def race_label(race: Race) -> str:
    """``RAW new_seq_lens_buf[0:2]``: the text next to a race connector."""
    return f"{race.kind} {race.buffer}{describe_elements(race.shape, race.elements)}"


def access_point(race_side: Access, by_op: dict[int, OpRecord]) -> tuple[str, int] | None:
    """Where one access of a race is drawn: its lane and time (the access's own time, else
    its op's end for a write, start for a read); None when neither is known."""
    rec = by_op.get(race_side.op)
    agent = race_side.agent if rec is None else rec.agent
    at = race_side.time_ns
    if at is None and rec is not None:
        at = rec.end_ns if race_side.mode == "write" else rec.start_ns
    return None if at is None else (agent, at)


#: px per character of an 8 pt label, and the label box's padding (both sides, px)
_LABEL_CHAR_PX, _LABEL_PAD_PX = 6.3, 16.0


def _label_x(mid_ns: float, text: str, span: tuple[int, int], px_per_ns: float
             ) -> float | None:
    """The x (in µs) of a label centred as near ``mid_ns`` as keeps it whole inside the axes,
    or None when the axes are narrower than the label."""
    half = (len(text) * _LABEL_CHAR_PX + _LABEL_PAD_PX) / 2 / px_per_ns  # ns
    lo, hi = span[0] + half, span[1] - half
    if lo > hi:
        return None
    return min(max(mid_ns, lo), hi) / 1e3


def draw_races(ax: Axes, races: Sequence[Race], timeline: Sequence[OpRecord], lanes: Any,
                span: tuple[int, int], px_per_ns: float) -> tuple[int, int]:
    """The races' connectors, their two ends marked, and a label where it does not cover the
    previous one; returns how many races the connectors drawn stand for, and how many
    connectors were drawn. Past
    :data:`MAX_SINGLE_RACES` races in view, one connector per pair of sites, at the pair's
    first race, labelled with its count (:func:`plotted_groups`); at most
    :data:`MAX_RACES_DRAWN` connectors. Everything stays inside the axes: an access outside
    the window is drawn at the window's edge with a hollow marker (its connector does not run
    off the plot), and a label is moved sideways to stay whole."""
    by_op = {t.op: t for t in timeline}
    ends_of: dict[int, tuple[tuple[str, int], tuple[str, int]]] = {}
    in_view = []
    for race in races:
        a, b = access_point(race.first, by_op), access_point(race.second, by_op)
        if a is None or b is None or a[0] not in lanes.names or b[0] not in lanes.names:
            continue
        if max(a[1], b[1]) < span[0] or min(a[1], b[1]) > span[1]:
            continue
        ends_of[id(race)] = (a, b)
        in_view.append(race)
    last_label_px = -1e18
    drawn = arrows = 0
    ends: tuple[list[float], list[float]] = ([], [])  # x, y of the ends in view
    outside: tuple[list[float], list[float]] = ([], [])  # ends moved to the window's edge
    for group in plotted_groups(in_view)[:MAX_RACES_DRAWN]:
        a, b = ends_of[id(group.race)]
        drawn += group.count
        arrows += 1
        points = []
        for lane, at in (a, b):
            shown = min(max(at, span[0]), span[1])
            target = ends if shown == at else outside
            target[0].append(shown / 1e3)
            target[1].append(lanes.y(lane))
            points.append((shown / 1e3, lanes.y(lane)))
        (xa, ya), (xb, yb) = points
        ax.add_artist(RaceArrow((xa, ya), (xb, yb)))
        times = f" \u00d7{group.count}" if group.count > 1 else ""
        what = race_label(group.race) if group.count == 1 else (
            f"{group.race.kind} {group.race.buffer}")  # the elements differ race to race
        state = {True: " (manifest)", False: " (latent)", None: ""}[group.manifest]
        text = f"{what}{times}{state}"  # a recorder's race is untimed: no state to say
        mid_ns = (xa + xb) / 2 * 1e3
        x = _label_x(mid_ns, text, span, px_per_ns)
        # label a connector only where the previous label is out of the way (16 iterations
        # of the same race would otherwise print on top of each other)
        if x is not None and x * 1e3 * px_per_ns - last_label_px > len(text) * 6.5 + 10:
            last_label_px = x * 1e3 * px_per_ns
            ax.annotate(text, xy=(x, (ya + yb) / 2 + 0.15), fontsize=8,
                        color=RACE_COLOR, ha="center", va="bottom", zorder=8,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": RACE_COLOR,
                              "lw": 0.6, "alpha": 0.9})
    if ends[0]:  # one line of markers, in the order a line per race drew them
        ax.plot(*ends, marker="X", color=RACE_COLOR, markersize=8, linestyle="none", zorder=7)
    if outside[0]:
        ax.plot(*outside, marker="o", markerfacecolor="white", color=RACE_COLOR,
                markersize=7, linestyle="none", zorder=7)
    return drawn, arrows
