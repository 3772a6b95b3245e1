"""Each recorded op's call stack, kept while a pull request's variants run.

The recorder names an op by its innermost user site only. Attributing a race to a changed
line needs more: the frames of the user's tree that led to it (the caller's wait three
frames up is what ordered the kernel). :class:`StackKeeper` observes every new node
(:data:`recorder.core.NODE_OBSERVERS`) and keeps the frames that lie in the tree or in the
harness's engine adapters (whose stand-ins issue some ops), innermost first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

Frame = tuple[str, int, str]  # absolute file, line, function's qualified name

_ADAPTERS = str(Path(__file__).resolve().parents[2]) + os.sep  # overlap_harness/engines/
_OWN = str(Path(__file__).resolve().parent) + os.sep
_DEPTH = 48


class StackKeeper:
    """The stacks of the ops of the recordings made while installed."""

    def __init__(self, tree_root: Path) -> None:
        self.prefix = str(tree_root) + os.sep
        self.stacks: dict[int, dict[int, tuple[Frame, ...]]] = {}  # id(recording) -> op -> frames
        self._kept: dict[Any, bool] = {}  # code object -> kept?
        self._interned: dict[tuple[Frame, ...], tuple[Frame, ...]] = {}

    def _keeps(self, code: Any) -> bool:
        kept = self._kept.get(code)
        if kept is None:
            name = code.co_filename
            kept = name.startswith(self.prefix) or (
                name.startswith(_ADAPTERS) and not name.startswith(_OWN))
            self._kept[code] = kept
        return kept

    def observe(self, recording: Any, op: int) -> None:
        """Keep the calling stack of ``recording``'s new node ``op``."""
        frames: list[Frame] = []
        frame = sys._getframe(2)
        while frame is not None and len(frames) < _DEPTH:
            code = frame.f_code
            if self._keeps(code):
                frames.append((code.co_filename, frame.f_lineno, code.co_qualname))
            frame = frame.f_back
        stack = tuple(frames)
        stack = self._interned.setdefault(stack, stack)
        self.stacks.setdefault(id(recording), {})[int(op)] = stack

    def of(self, recording: Any, op: int) -> tuple[Frame, ...]:
        """The frames kept for ``op`` of ``recording`` (empty when none were)."""
        return self.stacks.get(id(recording), {}).get(int(op), ())

    def is_tree_file(self, filename: str) -> bool:
        """True when ``filename`` (absolute) lies in the tree."""
        return filename.startswith(self.prefix)

    @contextmanager
    def installed(self) -> Iterator[StackKeeper]:
        """Observe new nodes inside the block."""
        from overlap_harness.recorder.core import NODE_OBSERVERS

        NODE_OBSERVERS.append(self.observe)
        try:
            yield self
        finally:
            NODE_OBSERVERS.remove(self.observe)
