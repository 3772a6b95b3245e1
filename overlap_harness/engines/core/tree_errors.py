"""A user's engine tree that does not import, said in one line a reader can act on.

An import of an engine tree with a syntax error, a missing module or an exception at import
time fails deep inside the import machinery; the traceback's last frames are importlib's and
the engine's, and its first are the harness's. What the user needs is the tree's own line:
``sglang/srt/managers/scheduler.py:4672: SyntaxError: invalid syntax``, its path relative to
the tree root (the folder that holds the engine's package). Engine-neutral: each adapter
calls :func:`import_failure` where its import fails.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path


def _relative(filename: str, root: Path | None) -> str:
    """``filename`` relative to ``root`` when it lies inside it, else as given."""
    path = os.path.abspath(filename)
    if root is not None:
        base = os.path.abspath(root)
        if path == base or path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return filename


def _inside(filename: str, root: Path | None) -> bool:
    if root is None:
        return False
    base = os.path.abspath(root)
    return os.path.abspath(filename).startswith(base + os.sep)


def import_failure(exc: BaseException, root: Path | None) -> str:
    """``FILE:LINE: TYPE: MESSAGE`` for an exception raised while importing the tree at
    ``root``: a syntax error at its own file and line; any other error at the innermost
    frame inside the tree (the tree's line that raised or imported what failed), else at the
    innermost frame of all; ``TYPE: MESSAGE`` alone when there is no frame."""
    kind = type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename:
        message = exc.msg or str(exc)
        return f"{_relative(exc.filename, root)}:{exc.lineno}: {kind}: {message}"
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if _inside(f.filename, root)]
    frame = inside[-1] if inside else (frames[-1] if frames else None)
    message = " ".join(str(exc).split())
    if frame is None:
        return f"{kind}: {message}"
    return f"{_relative(frame.filename, root)}:{frame.lineno}: {kind}: {message}"
