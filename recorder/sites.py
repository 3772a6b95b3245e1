"""Sites: the ``file:line`` of the user's code that issued an op.

A watched op is seen deep inside torch (a dispatch mode, a patched ``torch.cuda`` function),
so its site is the innermost frame of the call stack that belongs to none of: torch, this
package, the standard library's plumbing (contextlib, runpy, importlib, functools) and the
test runner. Paths are shown relative to the working directory when they lie under it, as a
compiler's diagnostics are.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import os
import runpy
import sys
from pathlib import Path
from types import FrameType

import torch

_SKIPPED_DIRS = tuple(
    str(Path(p).resolve().parent) + os.sep
    for p in (torch.__file__, __file__)
) + tuple(
    str(Path(m.__file__).resolve()) for m in (contextlib, functools, runpy)
) + (str(Path(importlib.__file__).resolve().parent) + os.sep, "<frozen ", "_pytest" + os.sep,
     "pluggy" + os.sep, "xdist" + os.sep, "execnet" + os.sep)  # test runners: pytest-xdist's
# workers run every test inside execnet's receive loop, which is no loop of the program

_HARNESS_FILES = ("overlap_harness" + os.sep + "check_cmd.py",
                  "overlap_harness" + os.sep + "pytest_races.py")


_PLUMBING_FILES: set[str] = set()  # stand-ins of other code (engine adapters' kernels)
_plumbing_changes = [0]  # how many times not_user_code added a file


def not_user_code(filename: str) -> None:
    """Treat ``filename`` as plumbing: sites are found in the code that called it (a stand-in
    for a kernel launch reports the engine line that launched the kernel)."""
    _PLUMBING_FILES.add(str(Path(filename).resolve()))
    is_user_file.cache_clear()
    _plumbing_changes[0] += 1


def plumbing_version() -> int:
    """Changes each time :func:`not_user_code` declares a file: what a cache of
    :func:`is_user_file`'s answers compares to know it is stale."""
    return _plumbing_changes[0]


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """True when ``filename`` is the user's code (not torch's, the recorder's, or plumbing)."""
    try:
        full = str(Path(filename).resolve())
    except (OSError, ValueError):
        full = filename
    if full.endswith(_HARNESS_FILES) or full in _PLUMBING_FILES:
        return False
    return not any(full.startswith(d) or d in full for d in _SKIPPED_DIRS)


@functools.lru_cache(maxsize=4096)
def display_path(filename: str) -> str:
    """``filename`` relative to the working directory when under it, else as given. Links
    are not followed: a module imported through a linked file (a tree that links most of
    its files to an installed copy) is named by the path it was imported from, even where
    the link's target lies under the working directory."""
    try:
        return str(Path(os.path.abspath(filename)).relative_to(Path.cwd()))
    except (OSError, ValueError):
        return filename


def user_site(skip: int = 1) -> str:
    """``file:line`` of the innermost frame of user code on the stack ("" when none)."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if is_user_file(filename):
            return f"{display_path(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def user_frame(skip: int = 1) -> FrameType | None:
    """The innermost frame of user code on the stack (None when there is none)."""
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def split_site(site: str) -> tuple[str, int | None]:
    """``("file.py", 12)`` from ``"file.py:12"``; ``(site, None)`` when it has no line."""
    file, _, line = site.rpartition(":")
    if file and line.isdigit():
        return file, int(line)
    return site, None





class SourceBusy(Exception):
    """A source file was asked for while another is being parsed (a trace callback or a
    finalizer running inside ``ast.parse``): Python 3.11's AST construction keeps its
    recursion depth in shared state, and a nested parse breaks the outer one with
    ``SystemError: AST constructor recursion depth mismatch``. The caller goes without."""


_parsing: list[bool] = [False]


@functools.lru_cache(maxsize=256)
def source_tree(filename: str) -> ast.Module | None:
    """The syntax tree of a source file (None when it cannot be read or parsed), cached.

    Raises:
        SourceBusy: another parse is in progress (not cached: asked again later, it parses).
    """
    if _parsing[0]:
        raise SourceBusy(filename)
    _parsing[0] = True
    try:
        return ast.parse(Path(filename).read_text(encoding="utf-8"), filename)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    finally:
        _parsing[0] = False
