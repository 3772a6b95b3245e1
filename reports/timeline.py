"""Timeline plots: one lane per agent, op bars, event arrows, races as red connectors.

What a person needs to see when a scenario races: which stream ran what and when, where the
iterations begin, which record each wait waited for, and between which two ops the race is.
The plot draws :class:`model.trace.OpRecord` timelines only, so a measured GPU run (same
schema) can be drawn under the simulated one on the same time axis. Matplotlib runs on the
Agg canvas (no display) without pyplot: pyplot keeps every figure until it is closed; these
are freed like any object, so a suite does not leak memory.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import OpKind, OpRecord, Race
from overlap_harness.reports.agg_text import CachedTextCanvas
from overlap_harness.reports.lanes import lane_order, wait_arrows
from overlap_harness.reports.race_arrow import RACE_COLOR
from overlap_harness.reports.race_connectors import draw_races

#: Face colour, edge colour and hatch by kind; zero-length kinds are drawn as markers.
STYLE: dict[OpKind, tuple[str, str, str]] = {
    OpKind.KERNEL: ("#4c78a8", "#2f4b6e", ""),
    OpKind.COPY: ("#54a24b", "#2f5e2a", ""),
    OpKind.HOST_WORK: ("#b8b8b8", "#707070", ""),
    OpKind.HOST_SYNC: ("#f4a6a0", "#c0392b", "///"),
}
MARKERS: dict[OpKind, tuple[str, str]] = {
    OpKind.RECORD: ("v", "#7b3294"),
    OpKind.WAIT: ("^", "#e08214"),
    OpKind.HOST_READ: ("o", "#333333"),
    OpKind.HOST_WRITE: ("s", "#333333"),
    OpKind.QUERY: ("d", "#333333"),
    OpKind.ALLOC: ("|", "#888888"),
    OpKind.FREE: ("|", "#888888"),
}
MAX_TITLE_LINES = 4
"""A title wraps to at most this many lines, the last ending in an ellipsis: a name of any
length leaves the axes their room."""
MAX_TITLE_NAME = 80
"""A run's name longer than this is cut, with an ellipsis, in its plot's title."""
MAX_TITLE_KEYS = 6
"""A title lists the race keys up to this many distinct ones, else their count by kind."""
MAX_LANE_LABEL = 32
"""A lane (stream) name longer than this is cut, with an ellipsis, in its tick label."""
MIN_AXES_SHARE = 0.25
"""The least share of the figure's width and height the axes keep, whatever the margins."""


def lane_label(name: str) -> str:
    """A lane's tick label: ``name``, or its first characters and an ellipsis."""
    return name if len(name) <= MAX_LANE_LABEL else name[:MAX_LANE_LABEL - 1] + "\u2026"


def iteration_starts(timeline: Sequence[OpRecord]) -> dict[int, int]:
    """Iteration n -> the earliest host issue time of an op of iteration n (ns)."""
    starts: dict[int, int] = {}
    for t in timeline:
        if t.iteration >= 0:
            starts[t.iteration] = min(starts.get(t.iteration, t.issue_ns), t.issue_ns)
    return dict(sorted(starts.items()))


def window_span(timeline: Sequence[OpRecord], window: tuple[int, int] | None) -> tuple[int, int]:
    """The time span (ns) of iterations ``window[0]..window[1]`` inclusive, or of the run."""
    lo = min((t.start_ns for t in timeline), default=0)
    hi = max((max(t.end_ns, t.issue_ns) for t in timeline), default=1)
    if window is None:
        return lo, max(hi, lo + 1)
    starts = iteration_starts(timeline)
    first, last = window
    if first > last:
        raise ValueError(f"window {first}:{last}: first iteration after last")
    lo = starts.get(first, lo)
    later = [v for k, v in starts.items() if k > last]
    # the last iteration's device work may run past the next one's first issue: keep it
    ends = [t.end_ns for t in timeline if first <= t.iteration <= last]
    hi = max([min(later)] if later else [hi]) if not ends else max(ends)
    return lo, max(hi, lo + 1)


@dataclass(slots=True)
class _Lanes:
    """Where each agent's lane is on the y axis of one axes."""

    names: list[str]

    def y(self, agent: str) -> float:
        return float(len(self.names) - 1 - self.names.index(agent))


def _draw_ops(ax: Axes, timeline: Sequence[OpRecord], lanes: _Lanes, span: tuple[int, int],
              px_per_ns: float) -> None:
    """Bars and markers, batched: one collection per (lane, kind), one line per marker kind.

    An artist per op made a 16-iteration plot cost about 0.6 s and the suite's 46 plots most
    of the report time (issue 17); the batched artists draw the same picture.
    """
    lo, hi = span
    bars: dict[tuple[float, OpKind], list[list[tuple[float, float]]]] = {}
    marks: dict[OpKind, tuple[list[float], list[float]]] = {}
    for t in timeline:
        if t.end_ns < lo or t.start_ns > hi:
            continue
        y = lanes.y(t.agent)
        if t.kind in STYLE and t.end_ns > t.start_ns:
            x0, x1 = t.start_ns / 1e3, t.start_ns / 1e3 + (t.end_ns - t.start_ns) / 1e3
            bars.setdefault((y, t.kind), []).append(
                [(x0, y - 0.3), (x0, y + 0.3), (x1, y + 0.3), (x1, y - 0.3)])
            text = t.name if t.label is None else f"{t.name} [{t.label}]"
            for candidate in (text, t.name):
                # ~6.5 px per character at 7 pt; only label bars that hold the whole name
                if len(candidate) * 6.5 < (t.end_ns - t.start_ns) * px_per_ns:
                    cx = max(t.start_ns, lo) / 2e3 + min(t.end_ns, hi) / 2e3
                    ax.text(cx, y, candidate, ha="center", va="center", fontsize=7,
                            color="black" if t.kind != OpKind.KERNEL else "white",
                            clip_on=True, zorder=3)
                    break
        elif t.kind in MARKERS:
            off = 0.38 if t.kind == OpKind.RECORD else -0.38 if t.kind == OpKind.WAIT else 0
            xs, ys = marks.setdefault(t.kind, ([], []))
            xs.append(t.start_ns / 1e3)
            ys.append(y + off)
    for (_, kind), boxes in bars.items():  # lane by lane: where bars overlap, the same order
        face, edge, hatch = STYLE[kind]
        # what broken_barh draws, without its unit handling (the limits are set already)
        ax.add_collection(PolyCollection(np.array(boxes), facecolors=face, edgecolors=edge,
                                         hatch=hatch, linewidth=0.5, zorder=2), autolim=False)
    for kind, (xs, ys) in marks.items():
        marker, color = MARKERS[kind]
        ax.plot(xs, ys, marker=marker, color=color, markersize=4, zorder=4, linestyle="none")


def _draw_arrows(ax: Axes, timeline: Sequence[OpRecord], lanes: _Lanes,
                 span: tuple[int, int], waits: Sequence[tuple[int, int]] = ()) -> None:
    """Record -> wait arrows (``waits``: the bindings the device made, else by name: see
    :func:`wait_arrows`), all in one quiver (an annotation each cost about a third of a
    plot's drawing time)."""
    lo, hi = span
    tails, heads = [], []
    for rec, wait in wait_arrows(timeline, waits):
        if lo <= rec.start_ns <= hi and lo <= wait.start_ns <= hi:
            tails.append((rec.start_ns / 1e3, lanes.y(rec.agent) + 0.38))
            heads.append((wait.start_ns / 1e3, lanes.y(wait.agent) - 0.38))
    if not tails:
        return
    xs, ys = zip(*tails, strict=True)
    dx = [h[0] - t[0] for h, t in zip(heads, tails, strict=True)]
    dy = [h[1] - t[1] for h, t in zip(heads, tails, strict=True)]
    ax.quiver(xs, ys, dx, dy, angles="xy", scale_units="xy", scale=1, color="#7b3294",
              alpha=0.6, width=0.0012, headwidth=5, headlength=6, headaxislength=5,
              zorder=3)


def _draw_iterations(ax: Axes, timeline: Sequence[OpRecord], span: tuple[int, int],
                     top: float) -> None:
    """A dashed line at each iteration's start, all in one collection (a line each was a
    fifth of a plot's building), and the iteration's number beside it."""
    starts = [(n, at / 1e3) for n, at in iteration_starts(timeline).items()
              if span[0] <= at <= span[1]]
    if not starts:
        return
    # x in data, y in axes coordinates: floor to ceiling, as axvline draws
    ax.vlines([x for _, x in starts], 0, 1, transform=ax.get_xaxis_transform(),
              colors="#555555", linestyles="--", linewidth=0.7, zorder=1)
    for n, x in starts:
        ax.text(x, top, f" {n}", fontsize=8, va="bottom", ha="left", color="#333333")


def _draw_lane_axes(ax: Axes, timeline: Sequence[OpRecord], races: Sequence[Race],
                    span: tuple[int, int], px_per_ns: float, heading: str,
                    lanes_set: bool = False, waits: Sequence[tuple[int, int]] = ()
                    ) -> tuple[int, int]:
    """One axes of lanes; ``lanes_set``: a kept axes whose lane ticks, limits and grid
    are those of ``timeline`` already; ``waits``: the run's record -> wait bindings."""
    lanes = _Lanes(lane_order(timeline))
    if not lanes_set:
        ax.set_yticks([lanes.y(a) for a in lanes.names], [lane_label(a) for a in lanes.names])
        ax.set_ylim(-0.7, len(lanes.names) - 0.2)
        ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.set_xlim(span[0] / 1e3, span[1] / 1e3)
    # y given: the heading stays just above the axes (where matplotlib would place it: no
    # ticks on top) without measuring every tick label at each draw to find that out
    ax.set_title(heading, fontsize=10, loc="left", y=1.0)
    _draw_iterations(ax, timeline, span, len(lanes.names) - 0.45)
    _draw_ops(ax, timeline, lanes, span, px_per_ns)
    _draw_arrows(ax, timeline, lanes, span, waits)
    return draw_races(ax, races, timeline, lanes, span, px_per_ns)


def _shift(timeline: Sequence[OpRecord]) -> list[OpRecord]:
    """A measured timeline moved so its first op starts at 0 (the sim's origin)."""
    t0 = min((min(t.issue_ns, t.start_ns) for t in timeline), default=0)
    return [replace(t, issue_ns=t.issue_ns - t0, start_ns=t.start_ns - t0, end_ns=t.end_ns - t0)
            for t in timeline]


def _legend(fig: Figure) -> None:
    names = {OpKind.KERNEL: "kernel", OpKind.COPY: "copy", OpKind.HOST_WORK: "host work",
             OpKind.HOST_SYNC: "host blocked (sync)"}
    handles: list = [Patch(facecolor=f, edgecolor=e, hatch=h, label=names[k])
                     for k, (f, e, h) in STYLE.items()]
    handles += [Line2D([], [], marker=MARKERS[k][0], color=MARKERS[k][1], linestyle="none",
                       label=label)
                for k, label in ((OpKind.RECORD, "event record"), (OpKind.WAIT, "event wait"),
                                 (OpKind.HOST_READ, "host read"),
                                 (OpKind.HOST_WRITE, "host write"),
                                 (OpKind.QUERY, "event query"),
                                 (OpKind.ALLOC, "alloc / free"))]
    handles.append(Line2D([], [], color="#7b3294", lw=0.8, label="record \u2192 wait"))
    handles.append(Line2D([], [], color="#555555", lw=0.7, linestyle="--",
                          label="iteration N starts"))
    handles.append(Line2D([], [], color=RACE_COLOR, lw=1.6, marker="X",
                          label="race (kind buffer \u00d7count; manifest / latent)"))
    handles.append(Line2D([], [], color=RACE_COLOR, marker="o", markerfacecolor="white",
                          linestyle="none", label="race access outside the window"))
    fig.legend(handles=handles, loc="lower right", ncol=math.ceil(len(handles) / 2),
               fontsize=7, frameon=False)


@functools.cache
def _legend_pixels(width_in: float, height_in: float, dpi: float
                   ) -> tuple[np.ndarray, int, int]:
    """The legend drawn alone on a blank figure of this size: the RGBA pixels of its box
    (with 2 px of margin) and the box's left and bottom offsets in pixels.

    The legend is the same in every plot and drawing it was a fifth of a plot's time (issue
    17 item 2), so a plot of a size already seen pastes these pixels instead. The blank
    figure has the plot's own size, so the legend lands on the same sub-pixel position and
    its hatch (tiled from the canvas corner) on the same phase: the pixels are those the
    legend draws in place (tests/reports/test_plot_jobs.py compares them)."""
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    CachedTextCanvas(fig)
    _legend(fig)
    fig.canvas.draw()
    box = fig.legends[0].get_window_extent()
    pixels = np.asarray(fig.canvas.buffer_rgba())
    height_px, width_px = pixels.shape[:2]
    left, right = max(0, math.floor(box.x0) - 2), min(width_px, math.ceil(box.x1) + 2)
    bottom, top = max(0, math.floor(box.y0) - 2), min(height_px, math.ceil(box.y1) + 2)
    return pixels[height_px - top:height_px - bottom, left:right].copy(), left, bottom


def _paste_legend(fig: Figure) -> None:
    """The legend of :func:`_legend` as the pixels of :func:`_legend_pixels` (for a PNG
    saved at the figure's dpi: an SVG keeps the vector legend)."""
    width_in, height_in = (float(x) for x in fig.get_size_inches())
    pixels, left, bottom = _legend_pixels(width_in, height_in, float(fig.dpi))
    fig.figimage(pixels, xo=left, yo=bottom, zorder=5)  # zorder: the legend's own


def races_phrase(case: CaseResult) -> str:
    """``2 races: RAW new_seq_lens_buf, WAR x``; past :data:`MAX_TITLE_KEYS` distinct races,
    their count and kinds instead (``97 races, 31 distinct: 12 RAW, 19 reuse``): a title
    that lists a hundred keys is cut before the reader learns anything."""
    n = len(case.races)
    if not n:
        return "no race"
    keys = list(dict.fromkeys(case.race_keys()))
    head = f"{n} race{'s' if n != 1 else ''}"
    if len(keys) <= MAX_TITLE_KEYS:
        return f"{head}: {', '.join(keys)}"
    kinds: dict[str, int] = {}
    for key in keys:
        kind = key.split(" ", 1)[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return f"{head}, {len(keys)} distinct: " + ", ".join(f"{c} {k}" for k, c in kinds.items())


def case_title(case: CaseResult) -> str:
    """``scenario[mutation]: removed X — race (2 races: RAW new_seq_lens_buf; ok)``; a name
    longer than :data:`MAX_TITLE_NAME` is cut, so the verdict stays in view. A run with no
    expectation (a user's program or engine tree: ``expect`` empty) gives its verdict alone,
    without ok or FAIL."""
    name = case.name
    parts = [name if len(name) <= MAX_TITLE_NAME else name[:MAX_TITLE_NAME - 1] + "\u2026"]
    if case.removed:
        parts.append(f": removed {', '.join(case.removed)}")
    races = races_phrase(case)
    if not case.expect:
        return "".join(parts) + f" \u2014 {case.verdict} ({races})"
    ok = "ok" if case.ok else f"FAIL, expected {case.expect}"
    return "".join(parts) + f" \u2014 {case.verdict} ({races}; {ok})"


def wrap_title(title: str, width_in: float, fontsize: float = 11) -> str:
    """``title`` broken into lines that fit ``width_in`` inches at ``fontsize`` points, at
    most :data:`MAX_TITLE_LINES` of them (the last cut with an ellipsis).

    A character of the default sans font is about 0.6 em wide, so a line holds
    ``width_in * 72 / (0.6 * fontsize)`` characters; long removed-sync lists and race keys
    would otherwise run off the figure's right edge.
    """
    chars = max(20, int(width_in * 72 / (0.6 * fontsize)) - 2)
    return textwrap.fill(title, width=chars, break_on_hyphens=False,
                         max_lines=MAX_TITLE_LINES, placeholder=" \u2026")


def _plot_failed_run(case: CaseResult, width: float) -> Figure:
    """A run with nothing to draw (refused or crashed): the title and the reason, not an
    empty axis."""
    reason = case.error or "the run recorded no ops"
    fig = agg_figure(width, 2.4)
    ax = fig.subplots()
    ax.set_axis_off()
    ax.text(0.0, 0.5, wrap_title(f"run failed: {reason}", width, 10), fontsize=10,
            color=RACE_COLOR, va="center", ha="left", transform=ax.transAxes)
    fig.suptitle(wrap_title(case_title(case), width), fontsize=11, x=0.01, ha="left",
                 color=RACE_COLOR)
    fig.tight_layout()
    return fig


def agg_figure(width_in: float, height_in: float) -> Figure:
    """A figure on the Agg canvas, not registered with pyplot: nothing to close, and the
    plot workers never import pyplot (a seventh of their start-up, issue 17 item 2)."""
    fig = Figure(figsize=(width_in, height_in))
    CachedTextCanvas(fig)
    return fig


#: Figures kept by :func:`plot_timeline` with ``reuse=True``, per process: (width, height,
#: lanes) -> the figure of the last plot of that layout.
_kept: dict[tuple[float, float, tuple[str, ...]], Figure] = {}


def _kept_figure(width: float, height: float, lanes: Sequence[str]) -> Figure | None:
    """The kept figure of this layout with its plotted artists removed (its axes, ticks,
    grid, labels and pasted legend stay), or None."""
    fig = _kept.get((width, height, tuple(lanes)))
    if fig is None:
        return None
    ax = fig.axes[0]
    for artist in [*ax.collections, *ax.lines, *ax.texts, *ax.patches, *ax.artists]:
        artist.remove()
    return fig


def plot_timeline(case: CaseResult, *, window: tuple[int, int] | None = None,
                  gpu: Sequence[OpRecord] | None = None, gpu_label: str = "measured GPU run",
                  width_in: float | None = None, raster_legend: bool = False,
                  reuse: bool = False) -> Figure:
    """Draw ``case``'s timeline (and ``gpu`` under it, same axis); returns the figure.

    ``raster_legend``: paste the legend as pixels drawn once per figure size (the same
    pixels, a fifth less time; for a PNG saved at the figure's dpi, never for an SVG).

    ``reuse`` (with ``raster_legend``, without ``gpu``): draw on the figure of the previous
    plot of the same size and lanes, emptied, instead of a new one: its axes, ticks and
    legend were a sixth of a plot's time (issue 17 item 2). The figure returned is then
    only good until the next such call: save it first.

    ``window=(first, last)`` zooms to those iterations. The width grows with the number of
    iterations shown (1.6 in each, 12 to 48 in) so 16 iterations keep their ops readable.
    A run with no timeline (the harness refused it) shows its error instead of an empty axis.
    """
    timeline = case.timeline
    if not timeline:
        return _plot_failed_run(case, width_in or 12.0)
    span = window_span(timeline, window)
    its = [n for n, at in iteration_starts(timeline).items() if span[0] <= at <= span[1]]
    width = width_in or min(48.0, max(12.0, 1.6 * len(its)))
    gpu_tl = _shift(gpu) if gpu else []
    n_lanes = len(lane_order(timeline))
    heights = [max(2.0, 0.55 * n_lanes + 1.0)]
    if gpu_tl:
        heights.append(max(2.0, 0.55 * len(lane_order(gpu_tl)) + 1.0))
    title = case_title(case)
    if case.error:
        title += f" \u2014 error: {case.error}"
    reuse = reuse and raster_legend and not gpu_tl
    lanes = lane_order(timeline)
    fig = _kept_figure(width, sum(heights) + 0.9, lanes) if reuse else None
    kept = fig is not None
    if fig is None:
        fig = agg_figure(width, sum(heights) + 0.9)
        fig.subplots(len(heights), 1, sharex=True, squeeze=False,
                     gridspec_kw={"height_ratios": heights})
        if reuse:
            _kept[(width, sum(heights) + 0.9, tuple(lanes))] = fig
    axes = fig.axes
    px_per_ns = (width * 0.85 * fig.dpi) / (span[1] - span[0])
    drawn, arrows = _draw_lane_axes(axes[0], timeline, case.races, span, px_per_ns,
                                    "simulated", lanes_set=kept, waits=case.waits)
    if gpu_tl:
        _draw_lane_axes(axes[1], gpu_tl, [], span, px_per_ns, gpu_label)
    axes[-1].set_xlabel("time (\u00b5s)")
    if drawn < len(case.races):
        title += f" [{drawn} of {len(case.races)} races in view]"
    if arrows < drawn:
        title += f" [{drawn} races drawn as {arrows} arrows, one per pair of sites]"
    if not kept:
        (_paste_legend if raster_legend else _legend)(fig)
    title = wrap_title(title, width)
    fig.suptitle(title, fontsize=11, x=0.01, ha="left",
                 color=RACE_COLOR if case.races or not case.ok else "black")
    _fit_margins(fig, timeline, gpu_tl, title.count("\n") + 1)
    return fig


def _fit_margins(fig: Figure, timeline: Sequence[OpRecord], gpu_tl: Sequence[OpRecord],
                 title_lines: int) -> None:
    """Margins from what the figure holds, in inches: lane names on the left, the title's
    lines on top, the legend and axis label below. ``tight_layout`` measured the same by
    drawing the whole figure once more (a fifth of a plot's time). Each margin is capped so
    the axes keep :data:`MIN_AXES_SHARE` of the figure both ways."""
    width, height = fig.get_size_inches()
    names = [lane_label(n) for n in lane_order(timeline) + lane_order(gpu_tl)]
    left_in = 0.25 + 0.075 * max((len(n) for n in names), default=4)  # 10 pt tick labels
    top_in = 0.25 + 0.2 * title_lines + 0.2  # 11 pt title lines, then the axes' heading
    bottom_in = 0.95  # x tick labels, "time (us)" and the legend's two rows
    right = 1 - 0.2 / width
    left = min(left_in / width, right - MIN_AXES_SHARE)
    bottom = min(bottom_in / height, (1 - MIN_AXES_SHARE) / 2)
    top = max(1 - top_in / height, bottom + MIN_AXES_SHARE)
    fig.subplots_adjust(left=left, right=right, top=top, bottom=bottom, hspace=0.35)


def save_plot(fig: Figure, stem: str | Path, formats: Sequence[str] = ("png", "svg"),
              dpi: float = 100) -> list[Path]:
    """Save ``fig`` as ``stem.<fmt>`` for each format; return the paths.

    PNGs use zlib level 1: a timeline is flat colour, so the file grows by about a tenth and
    the encode takes a fraction of the default level's time.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        extra = {"pil_kwargs": {"compress_level": 1}} if fmt == "png" else {}
        fig.savefig(path, format=fmt, dpi=dpi, **extra)
        out.append(path)
    return out
