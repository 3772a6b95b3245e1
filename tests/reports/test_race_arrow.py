"""The race connector's closed-form shrink is matplotlib's ``arc3`` connector shrunk by
matplotlib (the oracle: ``ConnectionStyle.Arc3``, which bisects each end to 0.01 px)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionStyle

from overlap_harness.reports.race_arrow import RaceArrow, ShrunkArc3

CASES = [
    ((0.0, 0.0), (100.0, 0.0), 2.8, 2.8),  # horizontal
    ((10.0, 50.0), (400.0, -20.0), 2.8, 2.8),  # long, diagonal
    ((5.0, 5.0), (5.0, 60.0), 2.8, 0.0),  # vertical, head not shrunk
    ((0.0, 0.0), (4.0, 0.0), 2.8, 2.8),  # shorter than both shrinks: B's circle holds A'
    ((0.0, 0.0), (2.0, 0.0), 2.8, 2.8),  # inside A's circle: left as it is
    ((0.0, 0.0), (0.0, 0.0), 2.8, 2.8),  # a race within one point
]


@pytest.mark.parametrize(("a", "b", "shrink_a", "shrink_b"), CASES)
def test_the_closed_form_shrink_is_matplotlibs(a, b, shrink_a, shrink_b) -> None:
    mine = ShrunkArc3(0.15)(a, b, shrinkA=shrink_a, shrinkB=shrink_b)
    theirs = ConnectionStyle.Arc3(rad=0.15)(a, b, shrinkA=shrink_a, shrinkB=shrink_b)
    assert list(mine.codes) == list(theirs.codes)
    assert np.abs(mine.vertices - theirs.vertices).max() < 0.02


def test_an_unshrunk_arc_is_not_the_shrunk_one() -> None:
    shrunk = ShrunkArc3(0.15)((0.0, 0.0), (100.0, 0.0), shrinkA=2.8, shrinkB=2.8)
    whole = ShrunkArc3(0.15)((0.0, 0.0), (100.0, 0.0), shrinkA=0.0, shrinkB=0.0)
    assert np.abs(shrunk.vertices - whole.vertices).max() > 2.0
    assert tuple(whole.vertices[0]) == (0.0, 0.0) and tuple(whole.vertices[-1]) == (100.0, 0.0)


@pytest.mark.parametrize("head", [(5.0, 5.0), (0.0, 5.0), (10.0, 10.0), (10.5, 5.0),
                                  (-3.0, 2.0), (5.0, 10.000001), (9.9999999, 0.0),
                                  (5.0, 10.03), (5.0, 10.1), (-0.05, 5.0), (0.05, 5.0)])
def test_the_head_test_is_the_axes_contains_point(head) -> None:
    fig = Figure(figsize=(4, 3), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    arrow = RaceArrow((1.0, 1.0), head)
    ax.add_artist(arrow)
    fig.canvas.draw()
    assert arrow._head_in_axes() == ax.contains_point(ax.transData.transform(head))


def test_heads_inside_and_outside_are_told_apart() -> None:
    fig = Figure(figsize=(4, 3), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xlim(0, 10)
    inside, outside = RaceArrow((1.0, 0.5), (5.0, 0.5)), RaceArrow((1.0, 0.5), (11.0, 0.5))
    ax.add_artist(inside)
    ax.add_artist(outside)
    assert inside._head_in_axes() and not outside._head_in_axes()
