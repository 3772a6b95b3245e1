"""Ctrl-C during an engine command: what finished before it travels up to the command, which
writes it (marked ``partial``) and ends at once.

:class:`Interrupted` is a :class:`KeyboardInterrupt` (code that does not know it stops as
for any Ctrl-C) carrying ``finished``: the variants' outcomes, or the necessity table's rows
of the sites whose children had answered. :func:`stop_children` ends forked children that
would otherwise run on after their parent (a SIGINT sent to the parent alone, as a job
runner sends it, never reaches them).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from typing import Any


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what had finished before it (``finished``; its shape is the raiser's)."""

    def __init__(self, finished: Any) -> None:
        super().__init__()
        self.finished = finished


def stop_children(pids: Iterable[int]) -> None:
    """Kill the forked children ``pids`` (SIGKILL: a child holds nothing to save; its result
    would only have come through its pipe) and reap them."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
