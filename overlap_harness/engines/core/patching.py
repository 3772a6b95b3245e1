"""Set attributes of live modules and objects for the length of a block, then restore them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

_ABSENT = object()


@contextmanager
def attributes_set(changes: Sequence[tuple[Any, str, Any]]) -> Iterator[None]:
    """``(owner, name, value)`` set in order inside the block; the old values (or absence)
    restored in reverse order after, also when the block raises."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, value in changes:
            saved.append((owner, name, owner.__dict__.get(name, _ABSENT)
                          if hasattr(owner, "__dict__") else getattr(owner, name, _ABSENT)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
