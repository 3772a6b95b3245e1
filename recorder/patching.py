"""Patch-and-restore: the one way the recorder replaces attributes while a watch runs.

CPU mode replaces ``torch.cuda`` names and a Tensor method, GPU mode wraps ``query()`` and the
stream constructor, declared kernels replace module functions: each is a list of
``(object, attribute, replacement)`` applied on entry and undone on exit, also when the block
raises, so nothing the recorder changed outlives the watch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

Patch = tuple[Any, str, Any]  # (object, attribute, replacement)

_MISSING = object()


@contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    """Apply ``patches`` in order inside the block; restore every original in reverse order on
    the way out, also when the block (or a later patch) raises. An attribute the object did not
    have itself, only inherited (or did not have at all), is deleted again."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for obj, name, value in patches:
            saved.append((obj, name, vars(obj).get(name, _MISSING) if hasattr(obj, "__dict__")
                          else getattr(obj, name, _MISSING)))
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
