"""The cached-text Agg canvas draws text as matplotlib's own Agg canvas does (issue 17 item 2).

The oracle is matplotlib's :class:`FigureCanvasAgg` drawing the same figure: the cached
canvas places each string on a whole pixel, so a string may sit up to half a pixel from
matplotlib's; the glyphs themselves must be matplotlib's.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from overlap_harness.reports import agg_text
from overlap_harness.reports.agg_text import CachedTextCanvas

STRINGS = ("RAW req_to_token[1, 0:10; 2, 0:6] (latent)", "fwd_prepare_d2h", " 12", "jy_Q",
           "time (\u00b5s)")


def text_figure(canvas_class, strings=STRINGS, dx: float = 0.0) -> np.ndarray:
    """RGBA pixels of a figure holding ``strings`` at whole-pixel origins (+ ``dx`` px)."""
    fig = Figure(figsize=(4, 2), dpi=100)
    canvas_class(fig)
    for i, text in enumerate(strings):
        # 400 x 200 px: x = 20 px (+dx), y = 20 + 35 i px from the bottom, whole pixels
        fig.text((20 + dx) / 400, (20 + 35 * i) / 200, text, fontsize=7 + 2 * i,
                 color="#d62728" if i % 2 else "black")
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba()).astype(int)


def test_text_on_whole_pixels_is_matplotlibs_text() -> None:
    mine, theirs = text_figure(CachedTextCanvas), text_figure(FigureCanvasAgg)
    assert (theirs != 255).any()  # text was drawn at all
    # overlapping glyphs are combined in one mask, not blended one after the other: a few
    # levels of rounding at most
    assert np.abs(mine - theirs).max() <= 2


def test_a_string_seen_before_is_stamped_from_the_cache() -> None:
    first = text_figure(CachedTextCanvas)
    masks, metrics = agg_text.cache_sizes()
    again = text_figure(CachedTextCanvas)
    assert agg_text.cache_sizes() == (masks, metrics)
    assert (first == again).all()


def test_sub_pixel_origins_round_to_the_nearest_pixel() -> None:
    theirs = text_figure(FigureCanvasAgg)
    near = text_figure(CachedTextCanvas, dx=0.3)
    assert np.abs(near - theirs).max() <= 2  # 0.3 px rounds to the same pixel
    far = text_figure(CachedTextCanvas, dx=0.7)
    shifted = np.roll(theirs, 1, axis=1)  # 0.7 px rounds to the next pixel to the right
    assert np.abs(far - shifted).max() <= 2
    assert np.abs(far - theirs).max() > 50  # the twin: one pixel off is another picture


def test_other_text_differs() -> None:
    other = text_figure(CachedTextCanvas, ("another string", *STRINGS[1:]))
    assert (other != text_figure(FigureCanvasAgg)).any()
