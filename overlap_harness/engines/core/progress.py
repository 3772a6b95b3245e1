"""Progress lines for the engines' long runs (the necessity table: minutes of forked children).

One :class:`Progress` per run says how far it is: ``necessity: site 5/37 scheduler.py:1402
(variant chunked_prefill 3/14), 41 s, about 4 min left``. On a terminal each step redraws
one line in place; on anything else (a pipe, a CI log) a step marked ``major`` is one line of
its own and the minor steps between are not printed, so a log gets a line per site, not per
variant. The lines go to stderr, so stdout keeps only the results. ``--quiet``
(:func:`show_progress`) turns them off. A forked child inherits its parent's
:class:`Progress` and writes through the same stream.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_SHOW = [True]


def show_progress(show: bool) -> None:
    """Print progress lines (the default) or not (``--quiet``)."""
    _SHOW[0] = show


def duration(seconds: float) -> str:
    """``41 s``, ``4 min``, ``1 h 05 min``: a duration as people read it in a progress line."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """The progress of one run of ``label`` (see the module doc)."""

    def __init__(self, label: str, stream: TextIO | None = None,
                 show: bool | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.show = _SHOW[0] if show is None else show
        self.redraw = self.show and self.stream.isatty()
        self.started = self.estimated_from = time.perf_counter()

    def phase(self) -> None:
        """From now on ``fraction`` counts a new phase: the estimate of what is left is made
        from the time since (a first phase of another pace, such as the probed pass, does not
        skew it)."""
        self.estimated_from = time.perf_counter()

    def step(self, what: str, fraction: float, major: bool = True) -> None:
        """Say that the run is at ``what``, ``fraction`` (0..1) of the way through (its
        phase); a step that is not ``major`` shows on a terminal only."""
        if not self.show or (not major and not self.redraw):
            return
        now = time.perf_counter()
        line = f"{self.label}: {what}, {duration(now - self.started)}"
        if fraction > 0:
            left = (now - self.estimated_from) * (1 - fraction) / fraction
            line += f", about {duration(left)} left"
        self._write(line)

    def done(self, what: str) -> None:
        """The run's last line, ``what`` and the time it took."""
        if self.show:
            self._write(f"{self.label}: {what} in {duration(time.perf_counter() - self.started)}")
            if self.redraw:
                self.stream.write("\n")
                self.stream.flush()

    def _write(self, line: str) -> None:
        if self.redraw:
            self.stream.write(f"\r{line}\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
