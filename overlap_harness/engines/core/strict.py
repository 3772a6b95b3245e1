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


class StrictModule(types.ModuleType):
    """A module with exactly the names given; any other name raises with the module's name."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        raise UnplannedUseError(f"{self.__name__}.{name}: not in the stub module "
                                "(only the names touched at import are provided)")


def strict_module(name: str, doc: str, names: Mapping[str, Any]) -> StrictModule:
    """A :class:`StrictModule` ``name`` holding ``names``, documented with ``doc``."""
    module = StrictModule(name, doc)
    module.__path__ = []  # a package, so submodule stubs can sit under it
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
