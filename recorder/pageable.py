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


CAPTURE_COPY_MESSAGE = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture "
                        "unless the CPU tensor is pinned. Please use tensor.pin_memory() or "
                        "allocate the tensor with pin_memory=True.")


def refuse_pageable_copy_in_capture(memory: Any, func: Any, args: tuple, kwargs: dict,
                                    device_involved: bool) -> None:
    """Raise PyTorch's error for a copy between pageable host memory and device memory issued
    on a capturing stream: the graph would keep the address of memory nothing keeps alive, so
    PyTorch refuses it during the capture (pytorch/pytorch#172156, torch 2.11 and later). The
    copies: ``copy_`` either way, ``.to(device)`` of a host tensor (``torch.tensor(...,
    device=...)`` is one), and ``index_put_`` of a host value into device memory (what
    ``dev[index_tensor] = 1.0`` does: the scalar becomes a host tensor moved to the device).
    A 0-dim host source of ``copy_`` is exempt only in ``fill_``'s form, which is not a copy."""
    if func is aten.copy_.default:
        sides = (args[0], args[1])
    elif func is aten._to_copy.default:
        sides = (args[0],) if device_involved else ()
        if sides and memory.lookup(args[0]) is not None:
            return  # device -> host: the blocking read the capture refuses already
    elif func in (aten.index_put_.default, aten._index_put_impl_.default):
        sides = (args[0], args[2]) if len(args) > 2 else (args[0], kwargs.get("values"))
    else:
        return
    infos = [memory.lookup(t) if isinstance(t, torch.Tensor) else False for t in sides]
    pageable = any(info is None for info in infos)
    device = device_involved if func is aten._to_copy.default else any(
        info is not None and info is not False and not info.pinned for info in infos)
    if pageable and device:
        raise RuntimeError(CAPTURE_COPY_MESSAGE)
