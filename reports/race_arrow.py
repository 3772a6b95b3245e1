"""The red race connector of a timeline plot, with its ends shrunk in closed form.

A racy plot holds up to 200 connectors, and matplotlib shrinks each arrow's ends (2 points
off both ops) by bisecting the curve against a circle in Python, in 20-odd steps per end:
that was two thirds of a connector's cost and a seventh of the suite's plot drawing (issue
17 item 2). :class:`ShrunkArc3` makes the same curve, matplotlib's ``arc3`` quadratic
Bézier, and finds where it leaves each circle by bisection on the polynomial in plain
floats, then takes the piece between as one quadratic (de Casteljau): the same arrow, its
ends within a thousandth of a pixel of matplotlib's (whose bisection stops at 0.01 px).
"""

from __future__ import annotations

import matplotlib
from matplotlib.patches import FancyArrowPatch
from matplotlib.path import Path

RACE_COLOR = "#d62728"
_EDGE = 2.0
"""Pixels: a head this close to the axes' edge is left to matplotlib's own test (which
counts a point up to the axes' edge line width outside as inside)."""
_BISECTIONS = 40
"""Halvings of the parameter interval: 2**-40 of a curve under 2,000 px is far below a
pixel."""


def _point(a: tuple[float, float], c: tuple[float, float], b: tuple[float, float],
           t: float) -> tuple[float, float]:
    """The quadratic Bézier (a, c, b) at ``t``."""
    u = 1.0 - t
    return (u * u * a[0] + 2 * t * u * c[0] + t * t * b[0],
            u * u * a[1] + 2 * t * u * c[1] + t * t * b[1])


def _inside(p: tuple[float, float], centre: tuple[float, float], radius: float) -> bool:
    """Strictly inside the circle (matplotlib's ``inside_circle``)."""
    return (p[0] - centre[0]) ** 2 + (p[1] - centre[1]) ** 2 < radius * radius


def _leave(a, c, b, centre, radius: float, t_in: float, t_out: float) -> float:
    """The parameter between ``t_in`` (inside the circle) and ``t_out`` (outside) where the
    curve crosses it."""
    for _ in range(_BISECTIONS):
        mid = (t_in + t_out) / 2
        if _inside(_point(a, c, b, mid), centre, radius):
            t_in = mid
        else:
            t_out = mid
    return (t_in + t_out) / 2


class ShrunkArc3:
    """A connection style: matplotlib's ``arc3,rad=...`` shrunk by ``shrinkA``/``shrinkB``
    pixels at its ends, as matplotlib shrinks it (an end whose circle holds the other end of
    the remaining curve is left as it is). Patches to clip against are not supported."""

    def __init__(self, rad: float) -> None:
        self.rad = rad

    def __call__(self, posA, posB, shrinkA: float = 2.0, shrinkB: float = 2.0,
                 patchA=None, patchB=None) -> Path:
        """The connector from ``posA`` to ``posB`` (display coordinates) as a path."""
        if patchA is not None or patchB is not None:
            raise ValueError("ShrunkArc3 does not clip against patches")
        a, b = (float(posA[0]), float(posA[1])), (float(posB[0]), float(posB[1]))
        dx, dy = b[0] - a[0], b[1] - a[1]
        c = ((a[0] + b[0]) / 2 + self.rad * dy, (a[1] + b[1]) / 2 - self.rad * dx)
        t0, t1 = 0.0, 1.0
        if shrinkA and not _inside(b, a, shrinkA):
            t0 = _leave(a, c, b, a, shrinkA, 0.0, 1.0)
        if shrinkB and not _inside(_point(a, c, b, t0), b, shrinkB):
            t1 = _leave(a, c, b, b, shrinkB, 1.0, t0)
        # the piece [t0, t1] of the curve: its control point is the blossom at (t0, t1)
        u0, u1 = 1.0 - t0, 1.0 - t1
        mid = (u0 * u1 * a[0] + (t0 * u1 + t1 * u0) * c[0] + t0 * t1 * b[0],
               u0 * u1 * a[1] + (t0 * u1 + t1 * u0) * c[1] + t0 * t1 * b[1])
        return Path([_point(a, c, b, t0), mid, _point(a, c, b, t1)],
                    [Path.MOVETO, Path.CURVE3, Path.CURVE3])


class RaceArrow(FancyArrowPatch):
    """A race connector: the arrow ``ax.annotate("", xy=end, xytext=start, arrowprops=...)``
    draws, without the annotation's empty text (its layout was a twentieth of a racy plot's
    time). Same geometry: positions in data coordinates, mutation scale the default font
    size, shrunk 2 points at both ends (:class:`ShrunkArc3`), not clipped; and, as the
    annotation, not drawn when its head lies outside the axes."""

    def __init__(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        super().__init__(start, end, arrowstyle="-|>", connectionstyle=ShrunkArc3(0.15),
                         color=RACE_COLOR, lw=1.6, shrinkA=2, shrinkB=2, zorder=6,
                         mutation_scale=matplotlib.rcParams["font.size"], clip_on=False)
        self._head = end

    def draw(self, renderer) -> None:
        """Draw unless the head is outside the axes (the annotation's clip rule)."""
        if self._head_in_axes():
            super().draw(renderer)

    def _head_in_axes(self) -> bool:
        """The annotation's test, ``axes.contains_point`` of the head in pixels; a head
        clearly inside or outside the axes' box is decided by the box alone (the test
        runs a point-in-path check, a tenth of a connector's time)."""
        x, y = self.axes.transData.transform(self._head)
        box = self.axes.bbox
        if box.x0 + _EDGE < x < box.x1 - _EDGE and box.y0 + _EDGE < y < box.y1 - _EDGE:
            return True
        if x < box.x0 - _EDGE or x > box.x1 + _EDGE or y < box.y0 - _EDGE or y > box.y1 + _EDGE:
            return False
        return bool(self.axes.contains_point((x, y)))
