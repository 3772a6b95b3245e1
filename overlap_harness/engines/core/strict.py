"""Strict stubs: stand-ins that fail loudly, naming what they were asked for.

A stub that answers ``None`` to an unplanned call can change the control flow of the code it
stands beside (a ``None`` batch is silently dropped), so every stand-in here knows exactly
which attributes it has; any other attribute, and any call of the stub itself, raises
:class:`UnplannedUseError` with the stub's name and the attribute's.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from overlap_harness.model.errors import HarnessError


class UnplannedUseError(HarnessError):
    """Code under test used a stub in a way its driver did not plan for.

    Not an ``AttributeError`` on purpose: a ``hasattr`` or ``getattr(x, name, default)`` probe
    of an unplanned name fails too, since its answer would choose a branch silently."""


class StrictStub:
    """An object with exactly the attributes given; anything else raises with its name.

    ``StrictStub("tree_cache", evict=fn, disable=False)``: ``stub.evict`` is ``fn``,
    ``stub.disable`` is False, ``stub.other`` and ``stub()`` raise :class:`UnplannedUseError`.
    Names in ``absent`` are planned to be missing (the real object has no such attribute, and
    the engine probes for it): they raise a plain ``AttributeError``. Attributes may be set
    later (the engine assigning its own fields is planned use)."""

    def __init__(self, stub_name: str, /, *, absent: tuple[str, ...] = (),
                 **attributes: Any) -> None:
        object.__setattr__(self, "_stub_name", stub_name)
        object.__setattr__(self, "_absent", frozenset(absent))
        for key, value in attributes.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or name in object.__getattribute__(
                self, "_absent"):
            raise AttributeError(name)  # protocol probes (copy, pickle), planned absences
        raise UnplannedUseError(f"{object.__getattribute__(self, '_stub_name')}.{name}: "
                                "not planned by the driver (strict stub)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise UnplannedUseError(f"{object.__getattribute__(self, '_stub_name')}() called: "
                                "not planned by the driver (strict stub)")

    def __repr__(self) -> str:
        return f"StrictStub({object.__getattribute__(self, '_stub_name')!r})"


def unplanned(qualified_name: str) -> Any:
    """A function that raises :class:`UnplannedUseError` naming ``qualified_name`` when called
    (a method the driver replaces because the real one must not run, and never expects)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnplannedUseError(f"{qualified_name}() called: not planned by the driver")

    refuse.__qualname__ = qualified_name
    return refuse


class StrictName:
    """A stand-in for a name a stub module was asked for at import (``from stub import f``,
    a default argument ``stub.Mode.X``): it can be held, named and its attributes taken (each
    another stand-in), but calling it, testing it, iterating or comparing it raises
    :class:`UnplannedUseError` with its full name: the code that really uses it fails loudly."""

    __slots__ = ("_qualified_name",)

    def __init__(self, qualified_name: str) -> None:
        object.__setattr__(self, "_qualified_name", qualified_name)

    def _refuse(self, what: str) -> UnplannedUseError:
        return UnplannedUseError(f"{object.__getattribute__(self, '_qualified_name')} {what}: "
                                 "a stand-in from a stub module (the real package is not "
                                 "installed), not planned by the driver")

    def __getattr__(self, name: str) -> StrictName:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StrictName(f"{object.__getattribute__(self, '_qualified_name')}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("called")

    def __bool__(self) -> bool:
        raise self._refuse("tested for truth")

    def __iter__(self) -> Iterator[Any]:
        raise self._refuse("iterated")

    def __eq__(self, other: object) -> bool:
        raise self._refuse("compared")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"StrictName({object.__getattribute__(self, '_qualified_name')!r})"


class StrictModule(types.ModuleType):
    """A module with exactly the names given; any other name raises with the module's name,
    or, in an open module (``open_names``), is answered by a :class:`StrictName` that fails
    when used (a release may import any name of the module it never calls)."""

    _open_names = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if self._open_names:
            return StrictName(f"{self.__name__}.{name}")
        raise UnplannedUseError(f"{self.__name__}.{name}: not in the stub module "
                                "(only the names touched at import are provided)")


def strict_module(name: str, doc: str, names: Mapping[str, Any], *,
                  open_names: bool = False) -> StrictModule:
    """A :class:`StrictModule` ``name`` holding ``names``, documented with ``doc``; with
    ``open_names`` any other name is a :class:`StrictName` stand-in."""
    module = StrictModule(name, doc)
    module.__path__ = []  # a package, so submodule stubs can sit under it
    module._open_names = open_names
    for key, value in names.items():
        setattr(module, key, value)
    return module


@contextmanager
def modules_installed(modules: Mapping[str, types.ModuleType]) -> Iterator[None]:
    """Put ``modules`` into ``sys.modules`` where no real module of that name is; restore
    the previous entries after (a real installed module always wins)."""
    added = [name for name in modules if name not in sys.modules]
    for name in added:
        sys.modules[name] = modules[name]
    try:
        yield
    finally:
        for name in added:
            if sys.modules.get(name) is modules[name]:
                del sys.modules[name]
