"""Portability notes: ``non_blocking=True`` copies to or from pageable host memory.

STREAM-SEMANTICS.md ('Pageable host memory'): on today's CUDA such a copy is synchronous for
the host where it matters (a D2H into pageable memory returns after the copy; an H2D from
pageable memory has read or staged its source before returning), but neither CUDA's notes
("might be synchronous") nor PyTorch's docs promise it. So it is not a race; the recorder
says where the program relies on it, naming the pageable tensor by the variable that holds it
in the user's frame (the copy's own name would say nothing), and the verdict and exit status
do not change. Pageable memory is host memory the recorder does not watch (not pinned).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from overlap_harness.recorder.core import Recording
from overlap_harness.recorder.sites import user_frame

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class PortabilityNote:
    """A non-blocking copy of pageable host memory: where, which way, which tensors."""

    op: int  # the copy's node
    direction: str  # "H2D" (from pageable memory) or "D2H" (into it)
    host_tensor: str | None  # the pageable tensor's variable (None: a temporary)
    device_tensor: str  # the device side's name in reports
    stream: str
    site: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What repeats of one note (a loop's iterations) share."""
        return (self.site, self.direction, self.host_tensor, self.stream)

    def describe(self) -> str:
        """The note as one line."""
        way = "from" if self.direction == "H2D" else "into"
        done = "has read its source" if self.direction == "H2D" else "has landed"
        tensor = self.host_tensor or "a temporary"
        pin = self.host_tensor or "the host tensor"
        return (f"{self.direction} copy {way} pageable host memory ({tensor}) with "
                f"non_blocking=True on stream {self.stream} at {self.site} is not a race: "
                f"today's CUDA returns from it only once the copy {done}, but neither CUDA nor "
                f"PyTorch promises that (pin {pin} for an asynchronous copy, or drop "
                "non_blocking)")


def note_pageable_copy(recording: Recording, memory: Any, func: Any, args: tuple,
                       kwargs: dict, out: Any, op: int, agent: int, site: str) -> None:
    """Add a note when the copy op ``func``, recorded as node ``op``, is a non-blocking one
    between device memory and pageable host memory (``memory.lookup`` is None for it)."""
    pair = _sides(func, args, kwargs, out)
    if pair is None:
        return
    destination, source = pair
    dst_info, src_info = memory.lookup(destination), memory.lookup(source)
    if dst_info is None and src_info is not None and not src_info.pinned:
        direction, host, device_name = "D2H", destination, src_info.name
    elif src_info is None and dst_info is not None and not dst_info.pinned:
        direction, host, device_name = "H2D", source, dst_info.name
    else:
        return
    recording.notes.append(PortabilityNote(op, direction, _variable_of(host), device_name,
                                           recording.detector.agent_names[agent], site))


def _sides(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[Any, Any] | None:
    """(destination, source) of a non-blocking copy op, else None."""
    if func is aten.copy_.default:
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return (args[0], args[1]) if non_blocking else None
    if func is aten._to_copy.default and isinstance(out, torch.Tensor):
        return (out, args[0]) if kwargs.get("non_blocking", False) else None
    return None


def _variable_of(tensor: torch.Tensor) -> str | None:
    """The name the user's innermost frame holds ``tensor`` (or a view of its storage) under:
    a local variable, or an attribute of one (``self.host_buf``)."""
    frame = user_frame(2)
    if frame is None:
        return None
    ptr = _storage_ptr(tensor)
    names = dict(frame.f_locals)
    for name, value in names.items():
        if value is tensor or (isinstance(value, torch.Tensor) and _storage_ptr(value) == ptr):
            return name
    for name, value in names.items():
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict) or isinstance(value, type | ModuleType):
            continue
        for attribute, held in attributes.items():
            if isinstance(held, torch.Tensor) and _storage_ptr(held) == ptr:
                return f"{name}.{attribute}"
    return None


def _storage_ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
