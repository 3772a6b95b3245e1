"""recorder.stored_views: which statements store the value a subscript just produced, and into
what. A stand-in source records what ``stored_into`` says at each ``src[...]``; the expected
answers are read off the statements by hand."""

from __future__ import annotations

import sys
from typing import Any

from overlap_harness.recorder.stored_views import stored_into


class _Source:
    """``src[k]`` notes what the statement around it does with the value."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, str]] = []

    def __getitem__(self, key: Any) -> list[int]:
        stored, container = stored_into(sys._getframe(1))
        self.seen.append((stored, type(container).__name__))
        return [1, 2, 3]


class _Destination:
    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _Holder:
    np: _Destination


GLOBAL_DESTINATION = _Destination()


def _statements(src: _Source, n: int) -> None:
    plain = _Destination()
    plain[:n] = src[:n]
    holder = _Holder()
    holder.np = _Destination()
    holder.np[1:n + 1] = src[2:2 + n]
    bufs = [_Destination()]
    bufs[0][:n] = src[:n]  # a container the scan does not evaluate
    named: dict[str, Any] = {}
    named["a"] = src[:n]
    kept = src[:n]
    size = len(src[:n])
    GLOBAL_DESTINATION[:n] = src[:n]
    plain[n] = src[n]
    assert kept and size


def test_stores_are_found_with_their_containers():
    src = _Source()
    _statements(src, 2)
    assert src.seen == [
        (True, "_Destination"), (True, "_Destination"), (True, "NoneType"), (True, "dict"),
        (False, "NoneType"), (False, "NoneType"), (True, "_Destination"),
        (True, "_Destination")]
