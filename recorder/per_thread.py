"""State each Python thread holds for itself while a watch runs.

torch keeps the current stream per thread, and the recorder's own switches (a paused dispatch
mode during a host read, the placement of fresh outputs) belong to the thread that set them:
another thread's ops at that moment must not see them. :class:`PerThread` is an attribute whose
value is each thread's own, starting from a default.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class PerThread:
    """A data descriptor: ``obj.name`` is the calling thread's value, ``default(obj)`` until
    that thread sets it."""

    def __init__(self, default: Callable[[Any], Any]) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _local(self, obj: Any) -> threading.local:
        try:  # made once per object: ``setdefault``'s argument was a new one per access
            return obj.__dict__["_per_thread"]  # type: ignore[no-any-return]
        except KeyError:
            return obj.__dict__.setdefault("_per_thread", threading.local())

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        try:  # the common case in one step (the recorder reads a switch several times an op)
            return getattr(obj.__dict__["_per_thread"], self.name)
        except (KeyError, AttributeError):
            pass
        local = self._local(obj)
        try:
            return getattr(local, self.name)
        except AttributeError:
            value = self.default(obj)
            setattr(local, self.name, value)
            return value

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(self._local(obj), self.name, value)
