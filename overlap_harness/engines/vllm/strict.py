"""Strict stand-ins: objects that answer only what the driver planned and fail loudly on
anything else, naming it. A stand-in that answered ``None`` to an unplanned question could
change the control flow of the engine code beside it (a skipped branch, a dropped batch).

Engine-neutral (nothing here knows vLLM): the shared core's strict stub, written beside the
vLLM adapter until the two cores are merged, with the same constructor and error type name.
"""

from __future__ import annotations

from typing import Any

from overlap_harness.model.errors import HarnessError


class UnplannedUseError(HarnessError, AttributeError):
    """Engine code used a stand-in in a way its driver did not plan for. Also an
    ``AttributeError``, so ``hasattr`` probes see a missing attribute, as on a real object."""


class StrictStub:
    """An object with exactly the attributes given: ``StrictStub("platform", is_cuda=f)``;
    any other attribute, and calling the stub, raise :class:`UnplannedUseError`."""

    def __init__(self, stub_name: str, /, **attributes: Any) -> None:
        object.__setattr__(self, "_stub_name", stub_name)
        for key, value in attributes.items():
            object.__setattr__(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = object.__getattribute__(self, "_stub_name")
        raise UnplannedUseError(f"{stub}.{name}: not planned by the driver (strict stub)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stub = object.__getattribute__(self, "_stub_name")
        raise UnplannedUseError(f"{stub}() called: not planned by the driver (strict stub)")

    def __repr__(self) -> str:
        return f"StrictStub({object.__getattribute__(self, '_stub_name')!r})"
