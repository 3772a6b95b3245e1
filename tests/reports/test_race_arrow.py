"""The race connector's closed-form shrink is matplotlib's ``arc3`` connector shrunk by
matplotlib (the oracle: ``ConnectionStyle.Arc3``, which bisects each end to 0.01 px)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.patches import ConnectionStyle

from overlap_harness.reports.race_arrow import ShrunkArc3

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
