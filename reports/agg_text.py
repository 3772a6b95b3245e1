"""An Agg canvas that renders each distinct text once per process and then stamps its pixels.

Text was about half of a timeline plot's drawing (issue 17 item 2): matplotlib's Agg renderer
lays out and rasterises every string glyph by glyph, each time it is drawn, and the suite's
54 plots draw the same strings again and again (tick labels, lane names, op names, iteration
numbers, race labels). :class:`CachedTextCanvas` keeps, per process, the coverage mask of
each (string, font, size, dpi) it has drawn and its width, height and descent, so a string
seen before costs one blit.

The one difference from matplotlib's own text: a string is placed on a whole pixel (rounded
from its sub-pixel origin), as matplotlib itself did before 3.10; its glyphs keep their
sub-pixel positions inside it. Rotated text, mathtext and TeX are left to matplotlib.
"""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.font_manager import FontProperties, fontManager, get_font
from matplotlib.ft2font import RenderMode

_IDENTITY = np.array([[0x10000, 0], [0, 0x10000]])
"""FreeType's identity transform (16.16 fixed point): unrotated, unslanted text."""

#: Coverage masks at most (a suite's plots hold a few thousand distinct strings).
MAX_CACHED = 20_000

# (string, font key, dpi, antialiased) -> (mask, left, top): the mask's top-left pixel
# relative to the string's origin (x right, y down from the baseline).
_masks: dict[tuple, tuple[np.ndarray, int, int]] = {}
# (string, font key, dpi) -> (width, height, descent) in pixels
_metrics: dict[tuple, tuple[float, float, float]] = {}
# (font key, dpi) -> (ascent, descent, line gap) in pixels
_heights: dict[tuple, tuple[float | None, float | None, float | None]] = {}


def _line_metrics(prop: FontProperties, dpi: float
                  ) -> tuple[float | None, float | None, float | None]:
    """The font's ascent, descent and line gap in pixels from its OS/2 (typographic) or
    hhea table; (None, None, None) when it has neither (the caller then measures "lp")."""
    font = get_font(fontManager._find_fonts_by_props(prop))
    scale = prop.get_size_in_points() * dpi / 72 / font.get_sfnt_table("head")["unitsPerEm"]
    os2 = font.get_sfnt_table("OS/2")
    if os2 is not None:
        return (os2["sTypoAscender"] * scale, -os2["sTypoDescender"] * scale,
                os2["sTypoLineGap"] * scale)
    hhea = font.get_sfnt_table("hhea")
    if hhea is not None:
        return hhea["ascent"] * scale, -hhea["descent"] * scale, hhea["lineGap"] * scale
    return None, None, None


def _font_key(prop: FontProperties) -> tuple:
    """What selects a font and its size: the fields ``FontProperties`` hashes."""
    return (tuple(prop.get_family()), prop.get_slant(), prop.get_variant(), prop.get_weight(),
            prop.get_stretch(), prop.get_size_in_points(), prop.get_file(),
            prop.get_math_fontfamily())


class CachedTextRenderer(RendererAgg):
    """:class:`RendererAgg` whose plain, unrotated text comes from the per-process caches."""

    def _get_font_height_metrics(self, prop: FontProperties
                                 ) -> tuple[float | None, float | None, float | None]:
        """(ascent, descent, line gap) of ``prop``'s font in pixels, remembered: the font's
        typographic line metrics (OS/2 table, else hhea) scaled to its size at this dpi.
        Matplotlib's text layout asks a renderer for these and otherwise looks the font up
        and reads its tables for every text drawn."""
        key = (_font_key(prop), self.dpi)
        found = _heights.get(key)
        if found is None:
            found = _line_metrics(prop, self.dpi)
            _heights[key] = found
        return found

    def get_text_width_height_descent(self, s, prop, ismath):
        """Matplotlib's measure of ``s``, remembered (plain text only)."""
        if ismath:
            return super().get_text_width_height_descent(s, prop, ismath)
        key = (s, _font_key(prop), self.dpi)
        found = _metrics.get(key)
        if found is None:
            found = super().get_text_width_height_descent(s, prop, ismath)
            if len(_metrics) < MAX_CACHED:
                _metrics[key] = found
        return found

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        """Stamp ``s``'s remembered coverage at its origin rounded to a whole pixel; rotated
        text, mathtext and text with OpenType features or a language go to matplotlib."""
        if ismath or angle % 360 or (mtext is not None and (
                mtext.get_fontfeatures() or mtext.get_language())):
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        antialiased = bool(gc.get_antialiased())
        key = (s, _font_key(prop), self.dpi, antialiased)
        found = _masks.get(key)
        if found is None:
            found = self._rasterize(s, prop, antialiased)
            if len(_masks) < MAX_CACHED:
                _masks[key] = found
        mask, left, top = found
        if mask.size:
            # draw_text_image takes the bitmap's bottom row, y downwards
            self._renderer.draw_text_image(mask, round(x) + left,
                                           round(y) + top + mask.shape[0], 0, gc)
        return None

    def _rasterize(self, s: str, prop: FontProperties, antialiased: bool
                   ) -> tuple[np.ndarray, int, int]:
        """The coverage of ``s`` drawn at origin (0, 0), glyph by glyph as matplotlib's Agg
        draws it, overlaps combined as Agg blends them (1 - (1-a)(1-b))."""
        font = self._prepare_font(prop)
        flags = get_hinting_flag()
        size = prop.get_size_in_points()
        mode = RenderMode.NORMAL if antialiased else RenderMode.MONO
        glyphs = []
        sized = set()  # fonts set to this size (a fallback font may serve some glyphs)
        for item in font._layout(s, flags=flags):
            ft = item.ft_object
            if id(ft) not in sized:
                ft.set_size(size, self.dpi)
                sized.add(id(ft))
            # identity transform; FreeType's y is upwards, origin on the baseline
            ft._set_transform(_IDENTITY, [round(0x40 * item.x), round(0x40 * item.y)])
            bitmap = ft._render_glyph(item.glyph_index, flags, mode)
            buffer = bitmap.buffer
            if buffer.size:
                if not antialiased:
                    buffer = buffer * 0xff
                glyphs.append((buffer, bitmap.left, -bitmap.top))  # top: rows down
        if not glyphs:
            return np.zeros((0, 0), np.uint8), 0, 0
        left = min(g[1] for g in glyphs)
        top = min(g[2] for g in glyphs)
        right = max(g[1] + g[0].shape[1] for g in glyphs)
        bottom = max(g[2] + g[0].shape[0] for g in glyphs)
        clear = np.ones((bottom - top, right - left), np.float32)
        for buffer, gx, gy in glyphs:
            rows, cols = slice(gy - top, gy - top + buffer.shape[0]), \
                slice(gx - left, gx - left + buffer.shape[1])
            clear[rows, cols] *= 1.0 - buffer * np.float32(1 / 255)
        mask = np.rint((1.0 - clear) * 255.0).astype(np.uint8)
        return mask, left, top


class CachedTextCanvas(FigureCanvasAgg):
    """:class:`FigureCanvasAgg` drawing with a :class:`CachedTextRenderer`."""

    def get_renderer(self):
        """The renderer of this canvas's size and dpi, made once (as matplotlib's)."""
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = CachedTextRenderer(w, h, self.figure.dpi)
            self._lastKey = key
        return self.renderer


def cache_sizes() -> tuple[int, int]:
    """(masks, metrics) remembered so far in this process."""
    return len(_masks), len(_metrics)
