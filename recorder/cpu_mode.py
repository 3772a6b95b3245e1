"""CPU mode: a program written for ``torch.cuda`` runs on the CPU, recorded as device work.

Device tensors are plain CPU tensors whose storages the recording knows as device memory
(:class:`CpuMemory`); :class:`FakeCudaFunctionMode` (a ``TorchFunctionMode``, which sees
every torch function, method and property before torch's C++ does) makes them look like
CUDA tensors: ``.device`` is ``cuda:0``, ``.is_cuda`` is True, and a ``device="cuda"``
argument makes a device tensor on the CPU. This layer, not torch, must handle what a CPU-only
build would refuse or get wrong: ``.to("cuda")``, ``.cuda()``, ``.cpu()`` (a copy, not the
same CPU tensor), ``pin_memory()``, ``record_stream``, and the host reads that bypass the
dispatcher (``.tolist()``, ``.numpy()``, printing). Everything else runs as the CPU op it is,
under the dispatch mode, which records it. Values are computed in issue order: the serial
oracle's values, whatever the streams.

Fact this builds on (found by a prototype, torch 2.x CPU builds): ``.to("cuda")`` and indexing
of a tensor that claims to be on CUDA fail inside torch before any dispatch or function mode
sees them; plain CPU tensors that only *look* like CUDA to Python code avoid that.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Recording, StorageInfo
from overlap_harness.recorder.dispatch import (
    HOST_READS,
    Placement,
    RecordingDispatchMode,
    access_of,
    register_storage,
    tensor_label,
)
from overlap_harness.recorder.fake_streams import CudaState, current_state
from overlap_harness.recorder.host_array_methods import host_array
from overlap_harness.recorder.host_arrays import HostArray
from overlap_harness.recorder.iterations import untraced
from overlap_harness.recorder.names import targets_here
from overlap_harness.recorder.numpy_entry import holds_host_array, torch_arguments
from overlap_harness.recorder.per_thread import PerThread
from overlap_harness.recorder.pinned_views import DeviceViews, reaches_host
from overlap_harness.recorder.sites import user_site

_TensorBase = torch._C.TensorBase
CUDA0 = torch.device("cuda", 0)


def _is_cuda(device: Any) -> bool:
    if device is None or isinstance(device, int):
        return isinstance(device, int)
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class CpuMemory:
    """Watched storages are keyed by their CPU data pointer (see :mod:`recorder.core`)."""

    placement = PerThread(lambda memory: Placement.INFER)  # each thread's own

    def __init__(self, recording: Recording, cuda: CudaState) -> None:
        self.recording = recording
        self.cuda = cuda
        self.placement = Placement.INFER
        self.device_views = DeviceViews()  # pinned memory kernels read directly (UVA)

    def lookup(self, t: torch.Tensor) -> StorageInfo | None:
        storage = t.untyped_storage()
        info = self.recording.storages.get(storage.data_ptr())
        if info is not None and not info.alive():  # freed; its address went to a new tensor
            self.recording.free(storage.data_ptr())
            return None
        return info

    def fresh_placement(self, t: torch.Tensor, device_involved: bool) -> str:
        return Placement.DEVICE if device_involved else Placement.HOST

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        info = self.lookup(t)
        if info is not None and not info.pinned:  # real code skips it on CPU tensors
            self.recording.record_stream(info, self.cuda.agent(stream))

    def current_agent(self) -> int:
        return self.cuda.agent(None)

    def register(self, t: torch.Tensor, pinned: bool, agent: int, label: str,
                 site: str | None = None) -> StorageInfo:
        return register_storage(self.recording, t, pinned, agent, label, site)

    @contextmanager
    def placed(self, placement: str) -> Any:
        """Fresh outputs of the ops inside live at ``placement``."""
        previous, self.placement = self.placement, placement
        try:
            yield
        finally:
            self.placement = previous


class FakeCudaFunctionMode(TorchFunctionMode):
    """Makes watched CPU tensors look like CUDA tensors (see the module docstring)."""

    def __init__(self, memory: CpuMemory, dispatch: RecordingDispatchMode) -> None:
        super().__init__()
        self.memory = memory
        self.dispatch = dispatch
        self.recording = memory.recording

    def _device_info(self, value: Any) -> StorageInfo | None:
        if isinstance(value, torch.Tensor):
            info = self.memory.lookup(value)
            if info is not None and not reaches_host(self.memory.device_views, info, value):
                return info
        return None

    @untraced
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.dispatch.live:  # in a thread that outlived the watch
            return func(*args, **kwargs)
        if holds_host_array(args, kwargs):  # NumPy views of pinned memory given to torch
            args, kwargs = torch_arguments(func, args, kwargs)
        getter = getattr(func, "__self__", None)
        if getter is _TensorBase.device:
            return CUDA0 if self._device_info(args[0]) is not None else func(*args)
        if getter is _TensorBase.is_cuda:
            return self._device_info(args[0]) is not None or func(*args)
        name = getattr(func, "__name__", "")
        handler = _METHODS.get(name) if args and isinstance(args[0], torch.Tensor) else None
        if handler is not None and (func is getattr(_TensorBase, name, None)
                                    or func is getattr(torch.Tensor, name, None)):
            return handler(self, *args, **kwargs)
        placement = Placement.INFER
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):  # (None is no CUDA device)
            kwargs["device"] = "cpu"
            placement = Placement.DEVICE
        elif device is not None and not kwargs.get("pin_memory"):
            with self.memory.placed(Placement.HOST):  # ``device="cpu"`` beside a device
                return func(*args, **kwargs)  # tensor (``empty_like(x, device="cpu")``)
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
            placement = Placement.PINNED
        if placement == Placement.INFER:
            out = func(*args, **kwargs)
            if (isinstance(out, torch.Tensor) and out.numel() and self.memory.lookup(out) is None
                    and not any(out is a for a in args)  # ``host.copy_(dev)``: host memory
                    and any(self._device_info(a) is not None for a in args)):
                self._adopt(out, Placement.DEVICE, name)  # e.g. ``new_tensor``, built in C++
            return out
        with self.memory.placed(placement):
            out = func(*args, **kwargs)
        self._adopt(out, placement, name)
        return out

    def _adopt(self, out: Any, placement: str, name: str) -> None:
        """Watch fresh results that no aten op produced (``torch.tensor(data, device=...)``
        builds its data in C++ and only lifts it through the dispatcher as an alias). On a GPU
        such a device tensor is a blocking copy from pageable host memory, which synchronizes
        its stream: the host is ordered after it, as after ``.item()``. Inside a declared
        kernel's CPU implementation (``dispatch.quiet``) it is only watched: the real kernel
        makes no such copy."""
        if self.dispatch.paused:  # recording nothing (the overhead benchmark's baseline)
            return
        outputs = out if isinstance(out, tuple | list) else (out,)
        site, targets = user_site(), targets_here()
        for position, t in enumerate(outputs):
            if (isinstance(t, torch.Tensor) and not t.untyped_storage().nbytes()
                    and self.dispatch.resizes is not None):  # device memory once grown
                self.dispatch.resizes.note_empty(t, placement == Placement.PINNED)
            if isinstance(t, torch.Tensor) and t.numel() and self.memory.lookup(t) is None:
                pinned = placement == Placement.PINNED
                agent = HOST_AGENT if pinned else self.memory.current_agent()
                label = tensor_label(name, site, position, len(outputs), targets)
                info = self.memory.register(t, pinned, agent, label, site)
                if self.dispatch.quiet:  # a declared kernel's CPU implementation builds it:
                    continue  # watched, but neither its op nor a host sync is the program's
                kind = OpKind.HOST_WRITE if pinned else OpKind.COPY
                op = self.recording.op(name, agent, [access_of(info, t, True)], kind)
                if not pinned:  # host data copied in from pageable memory: torch blocks the
                    # host until the stream has run it (and everything before it there)
                    self.recording.host_sync(f"{name} (blocking)", [op])

    # -- methods torch itself cannot run or would get wrong on a CPU-only build ------------
    def _to(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        copy = bool(kwargs.pop("copy", False))  # Tensor.to takes it; _parse_to does not
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        on_device = self._device_info(t) is not None
        plain: dict[str, Any] = {"dtype": dtype or t.dtype, "copy": copy}
        if memory_format is not None:
            plain["memory_format"] = memory_format
        if device is None or device.type == ("cuda" if on_device else "cpu"):
            return t.to(**plain)  # same side: a dtype change or a copy, recorded as is
        if device.type == "cuda":  # host -> device
            with self.memory.placed(Placement.DEVICE):
                out = t.to(**{**plain, "copy": True, "non_blocking": non_blocking})
        elif device.type == "cpu":  # device -> host: pinned when non-blocking, as torch does
            with self.memory.placed(Placement.PINNED if non_blocking else Placement.HOST):
                out = t.to(**{**plain, "copy": True, "non_blocking": non_blocking})
        else:
            return t.to(*args, **kwargs)
        return out  # a blocking copy's host sync is the dispatch mode's (``_to_copy``)

    def _cuda(self, t: torch.Tensor, device: Any = None, non_blocking: bool = False,
              memory_format: Any = None) -> torch.Tensor:
        extra = {} if memory_format is None else {"memory_format": memory_format}
        return self._to(t, "cuda", non_blocking=non_blocking, **extra)

    def _cpu(self, t: torch.Tensor, memory_format: Any = None) -> torch.Tensor:
        extra = {} if memory_format is None else {"memory_format": memory_format}
        return self._to(t, "cpu", **extra)

    def _pin_memory(self, t: torch.Tensor, device: Any = None) -> torch.Tensor:
        info = self.memory.lookup(t)
        if info is not None and info.pinned:
            return t
        if info is not None:
            raise RuntimeError("cannot pin 'torch.cuda' memory: only dense CPU tensors can be "
                               "pinned")
        with self.memory.placed(Placement.PINNED):
            return t.clone()

    def _is_pinned(self, t: torch.Tensor, device: Any = None) -> bool:
        info = self.memory.lookup(t)
        return info is not None and reaches_host(self.memory.device_views, info, t)

    def _get_device(self, t: torch.Tensor) -> int:
        return 0 if self._device_info(t) is not None else -1

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """``Tensor.record_stream``: torch's argument parser refuses a faked stream before
        any mode sees the call, so the method itself is patched (:meth:`patches`)."""
        self.memory.record_stream(t, stream)

    def patches(self) -> list[tuple[Any, str, Any]]:
        """Tensor methods patched while the mode runs."""
        return [(torch.Tensor, "record_stream",
                 lambda tensor, stream: self.record_stream(tensor, stream))]

    def _data_ptr(self, t: torch.Tensor) -> int:
        """A raw pointer handed out: of device memory, an op of unknown access on the current
        stream; of pinned memory (reached as host memory), one on the host."""
        info = self.memory.lookup(t)
        if info is not None and not (self.dispatch.paused or self.dispatch.quiet):
            host = reaches_host(self.memory.device_views, info, t)
            agent = HOST_AGENT if host else self.memory.current_agent()
            self.recording.unknown("data_ptr", agent, [info.name])
        return t.data_ptr()

    def _host_read(self, name: str, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Reads that bypass the dispatcher: a blocking copy of device memory (a copy on the
        current stream, then a host sync on it), or a host read of pinned memory."""
        if self.dispatch.quiet and not self.dispatch.paused:
            # inside a declared kernel's CPU implementation: the real kernel reads device
            # memory on its stream and never makes the host wait, so neither this read nor a
            # host sync is the program's (a sync here would order the host after the stream
            # and hide its races); a pinned tensor's NumPy form is a plain unrecorded array
            self.dispatch.paused += 1
            try:
                return getattr(torch.Tensor, name)(t, *args, **kwargs)
            finally:
                self.dispatch.paused -= 1
        info = self.memory.lookup(t)
        if name == "numpy" and info is not None and info.pinned:
            return self.host_view(t)  # a view of the memory: its reads and writes recorded
        if info is not None and not self.dispatch.paused:
            access = access_of(info, t, False)
            if info.pinned:
                self.recording.op(name, HOST_AGENT, [access], OpKind.HOST_READ)
            else:
                op = self.recording.op(name, self.memory.current_agent(), [access],
                                       OpKind.COPY)
                self.recording.host_sync(f"{name} (blocking)", [op])
        self.dispatch.paused += 1
        try:
            return getattr(torch.Tensor, name)(t, *args, **kwargs)
        finally:
            self.dispatch.paused -= 1


    def host_view(self, t: Any) -> HostArray | None:
        """The recorded NumPy view of a watched pinned tensor ``t`` (reached as host memory),
        else None; taking it reads nothing."""
        if not isinstance(t, torch.Tensor):
            return None
        info = self.memory.lookup(t)
        if info is None or not reaches_host(self.memory.device_views, info, t):
            return None
        cuda = self.memory.cuda
        return host_array(self.recording, info, t, lambda: current_state() is cuda)


def _reader(name: str) -> Any:
    def read(mode: FakeCudaFunctionMode, t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return mode._host_read(name, t, *args, **kwargs)
    return read


_METHODS: dict[str, Any] = {
    "to": FakeCudaFunctionMode._to,
    "cuda": FakeCudaFunctionMode._cuda,
    "cpu": FakeCudaFunctionMode._cpu,
    "pin_memory": FakeCudaFunctionMode._pin_memory,
    "is_pinned": FakeCudaFunctionMode._is_pinned,
    "get_device": FakeCudaFunctionMode._get_device,
    "data_ptr": FakeCudaFunctionMode._data_ptr,
    **{name: _reader(name) for name in HOST_READS},
}
