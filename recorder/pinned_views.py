"""Device (UVA) views of pinned host memory; NumPy views are in :mod:`recorder.host_arrays`.

**Device views (zero-copy, UVA).** A kernel given a device pointer to pinned host memory
reads the host buffer itself (vLLM's ``UvaBufferPool``: ``get_cuda_view_from_cpu_tensor``).
Such an access is the kernel's stream's access of the *pinned buffer* (STREAM-SEMANTICS.md,
"Device reads of pinned host memory"): a host rewrite of the buffer races a kernel that is
not ordered before it. In CPU mode :func:`device_view_of` returns an alias of the pinned
tensor that looks like a CUDA tensor; every op that touches it is recorded on the current
stream, against the pinned buffer's storage. Views of a device view are device views
(:meth:`DeviceViews.propagate`, called by the dispatch mode for view ops).

**NumPy views** of pinned memory (``pinned.numpy()``) are :mod:`recorder.host_arrays`'.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from overlap_harness.recorder.core import StorageInfo


class DeviceViews:
    """Which tensor objects are device views of pinned memory (keyed by identity)."""

    def __init__(self) -> None:
        self._views: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        key = id(t)
        self._views[key] = weakref.ref(t, lambda _ref, key=key: self._views.pop(key, None))

    def is_device_view(self, t: Any) -> bool:
        """True for a device view of pinned memory, or a view taken of one."""
        if not self._views:  # none exists (most programs: asked of every view op's inputs)
            return False
        ref = self._views.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def propagate(self, args: tuple, out: Any) -> None:
        """After a view op: its outputs are device views when an input was one."""
        if not self._views or not any(self.is_device_view(a) for a in args):
            return
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.add(t)


def reaches_host(views: DeviceViews | None, info: StorageInfo, t: Any) -> bool:
    """Whether an access of ``t`` (watched storage ``info``) reads or writes host memory as
    the host sees it: pinned storage not reached through a device view. ``views`` is None
    where the mode has no device views (GPU mode: UVA views are real device tensors there)."""
    return info.pinned and not (views is not None and views.is_device_view(t))


def device_view_of(views: DeviceViews, pinned: torch.Tensor) -> torch.Tensor:
    """CPU mode's ``get_cuda_view_from_cpu_tensor``: an alias of ``pinned`` (same memory,
    same watched storage) that the program sees as a CUDA tensor."""
    if not pinned.is_pinned():
        raise RuntimeError("get_cuda_view_from_cpu_tensor: the tensor must be pinned host "
                           "memory (a device view of pageable memory does not exist)")
    with torch._C.DisableTorchFunction():
        view = pinned.as_strided(pinned.size(), pinned.stride(), pinned.storage_offset())
    views.add(view)
    return view
