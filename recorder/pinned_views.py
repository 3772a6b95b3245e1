"""Two other ways into pinned host memory: device (UVA) views and NumPy views.

**Device views (zero-copy, UVA).** A kernel given a device pointer to pinned host memory
reads the host buffer itself (vLLM's ``UvaBufferPool``: ``get_cuda_view_from_cpu_tensor``).
Such an access is the kernel's stream's access of the *pinned buffer* (STREAM-SEMANTICS.md,
"Device reads of pinned host memory"): a host rewrite of the buffer races a kernel that is
not ordered before it. In CPU mode :func:`device_view_of` returns an alias of the pinned
tensor that looks like a CUDA tensor; every op that touches it is recorded on the current
stream, against the pinned buffer's storage. Views of a device view are device views
(:meth:`DeviceViews.propagate`, called by the dispatch mode for view ops).

**NumPy views.** ``pinned.numpy()`` shares the pinned memory; a write through it
(``buf.np[:n] = x``) is a host write that no torch op sees. In CPU mode ``.numpy()`` of a
watched pinned tensor returns a :class:`HostArray`, which records item assignment, ``fill``
and ufunc outputs as host writes, and reads that produce values (a scalar, a fancy-indexed copy,
``tolist``, ``copy``, a ufunc input) as host reads. Taking a basic slice reads nothing (a
view, as in NumPy). Not seen: NumPy functions that read through ``__array_function__``
(``np.sum(view)``) and raw pointers (``ctypes``).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Access, Recording, StorageInfo
from overlap_harness.recorder.elements import to_storage_elements


class DeviceViews:
    """Which tensor objects are device views of pinned memory (keyed by identity)."""

    def __init__(self) -> None:
        self._views: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        key = id(t)
        self._views[key] = weakref.ref(t, lambda _ref, key=key: self._views.pop(key, None))

    def is_device_view(self, t: Any) -> bool:
        """True for a device view of pinned memory, or a view taken of one."""
        ref = self._views.get(id(t)) if isinstance(t, torch.Tensor) else None
        return ref is not None and ref() is t

    def propagate(self, args: tuple, out: Any) -> None:
        """After a view op: its outputs are device views when an input was one."""
        if not any(self.is_device_view(a) for a in args):
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


class HostArray(np.ndarray):
    """A NumPy view of watched pinned memory that records the host's accesses through it."""

    _recording: Recording | None
    _info: StorageInfo | None
    _base_ptr: int
    _live: Any

    def __array_finalize__(self, obj: Any) -> None:
        self._recording = getattr(obj, "_recording", None)
        self._info = getattr(obj, "_info", None)
        self._base_ptr = getattr(obj, "_base_ptr", 0)
        self._live = getattr(obj, "_live", None)

    # -- element sets ----------------------------------------------------------------------
    def _watched(self) -> bool:
        return (self._recording is not None and self._live is not None and self._live()
                and self._info is not None and self._info.alive())

    def _element_ids(self) -> np.ndarray:
        """The storage element (of this array's item size) behind each item."""
        itemsize = self.itemsize
        first = (self.__array_interface__["data"][0] - self._base_ptr) // itemsize
        ids = np.full(self.shape, first, dtype=np.int64)
        for axis, (size, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            shape = [1] * self.ndim
            shape[axis] = size
            ids = ids + (np.arange(size, dtype=np.int64) * (stride // itemsize)).reshape(shape)
        return ids

    def _record(self, name: str, key: Any, write: bool) -> None:
        if not self._watched():
            return
        ids = self._element_ids()
        ids = np.asarray(ids if key is None else ids[key]).reshape(-1)
        info = self._info
        access = Access(info, np.unique(to_storage_elements(ids, self.itemsize, info.itemsize)),
                        write)
        kind = OpKind.HOST_WRITE if write else OpKind.HOST_READ
        self._recording.op(name, HOST_AGENT, [access], kind)

    # -- accesses --------------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        self._record("ndarray.__setitem__", key, True)
        np.ndarray.__setitem__(self.view(np.ndarray), key, _plain(value))

    def __getitem__(self, key: Any) -> Any:
        out = np.ndarray.__getitem__(self, key)
        if isinstance(out, HostArray) and _shares(out, self):
            return out  # a view: reads nothing yet
        self._record("ndarray.__getitem__", key, False)
        return out.view(np.ndarray) if isinstance(out, np.ndarray) else out

    def fill(self, value: Any) -> None:
        self._record("ndarray.fill", None, True)
        self.view(np.ndarray).fill(value)

    def tolist(self) -> Any:
        self._record("ndarray.tolist", None, False)
        return self.view(np.ndarray).tolist()

    def copy(self, order: str = "C") -> np.ndarray:
        self._record("ndarray.copy", None, False)
        return self.view(np.ndarray).copy(order)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        for value in inputs:
            if isinstance(value, HostArray):
                value._record(f"np.{ufunc.__name__}", None, False)
        outs = kwargs.get("out", ())
        for value in outs if isinstance(outs, tuple) else (outs,):
            if isinstance(value, HostArray):
                value._record(f"np.{ufunc.__name__}", None, True)
        if outs:
            outs = outs if isinstance(outs, tuple) else (outs,)
            kwargs["out"] = tuple(_plain(v) for v in outs)
        result = getattr(ufunc, method)(*(_plain(v) for v in inputs), **kwargs)
        if outs:  # NumPy hands back the ``out`` arrays themselves
            return outs[0] if len(outs) == 1 else outs
        return result


def _plain(value: Any) -> Any:
    return value.view(np.ndarray) if isinstance(value, HostArray) else value


def _shares(view: np.ndarray, base: np.ndarray) -> bool:
    return view.size == 0 or np.shares_memory(view.view(np.ndarray), base.view(np.ndarray))


def host_array(recording: Recording, info: StorageInfo, t: torch.Tensor, live: Any) -> HostArray:
    """``t.numpy()`` for a watched pinned tensor: a :class:`HostArray` over its memory.
    ``live()`` says whether the watch that made it still runs (after it, nothing records)."""
    with torch._C.DisableTorchFunction():
        plain = t.numpy()
        base_ptr = t.untyped_storage().data_ptr()
    array = plain.view(HostArray)
    array._recording = recording
    array._info = info
    array._base_ptr = base_ptr
    array._live = live
    return array
