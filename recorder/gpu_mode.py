"""GPU mode: the same recording on real CUDA streams.

The aten ops come from the same dispatch mode as in CPU mode; streams, events and syncs come
from PyTorch's GPU trace hooks (``torch.cuda._gpu_trace``: event record / wait / sync, stream
and device syncs, stream creation), which torch calls from C++ for every such action, the feed
CSAN is built on. ``query()`` is not traced, so ``Event.query`` and ``Stream.query`` are
wrapped: a True answer is an observation of the captured work (on a GPU the answer is the
device's, so a program that branches on it may take the other branch than in CPU mode, which
answers False first).

Memory: device storages are keyed by their device pointer and watched through a weak reference,
exactly as in CPU mode, and a storage that existed before the watch began is adopted at its
first use. Block reuse is decided by :class:`model.allocator.BlockPool`, not by the real
caching allocator's addresses, so both modes report the same reuse races.

The trace hooks cannot be unregistered; they are registered once and forward to the recording
of the running watch (none outside one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode

from recorder.core import Recording, StorageInfo
from recorder.dispatch import Placement
from recorder.sites import assigned_name, user_site

_ACTIVE: list[GpuMemory] = []
_HOOKS_REGISTERED: list[bool] = []


class GpuMemory:
    """Watched CUDA storages (device pointer keys) and pinned host storages."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.placement = Placement.INFER
        self.stream_names: dict[int, str] = {}

    def lookup(self, t: torch.Tensor) -> StorageInfo | None:
        if t.device.type != "cuda" and not (t.device.type == "cpu" and t.is_pinned()):
            return None
        storage = t.untyped_storage()
        key = storage.data_ptr()
        info = self.recording.storages.get(key)
        if info is not None and not info.alive():
            self.recording.free(key)
            info = None
        if info is None and t.numel():  # allocated before the watch began
            pinned = t.device.type == "cpu"
            info = self.register(t, pinned, self.current_agent(), "before-watch tensor")
        return info

    def fresh_placement(self, t: torch.Tensor, device_involved: bool) -> str:
        if t.device.type == "cuda":
            return Placement.DEVICE
        return Placement.PINNED if t.is_pinned() else Placement.HOST

    def stream_agent(self, stream_handle: int) -> int:
        default = torch.cuda.default_stream().cuda_stream
        name = "default" if stream_handle == default else self.stream_names.get(
            stream_handle, f"stream{len(self.stream_names) + 1}")
        return self.recording.agent(("cuda", stream_handle), name)

    def current_agent(self) -> int:
        return self.stream_agent(torch.cuda.current_stream().cuda_stream)

    def register(self, t: torch.Tensor, pinned: bool, agent: int, label: str) -> StorageInfo:
        storage = t.untyped_storage()
        weak = StorageWeakRef(storage)
        itemsize = t.element_size()
        return self.recording.allocate(storage.data_ptr(), storage.nbytes() // itemsize,
                                       itemsize, t.dtype, tuple(t.shape), pinned, agent,
                                       lambda: not weak.expired(), label)


def _forward(handler: str) -> Any:
    def hook(*args: Any) -> None:
        if _ACTIVE:
            getattr(_Hooks, handler)(_ACTIVE[-1], *args)
    return hook


class _Hooks:
    """What each GPU trace callback does to the running recording."""

    @staticmethod
    def on_stream_creation(memory: GpuMemory, stream: int) -> None:
        name = assigned_name(user_site()) or f"stream{len(memory.stream_names) + 1}"
        memory.stream_names[stream] = name

    @staticmethod
    def on_event_record(memory: GpuMemory, event: int, stream: int) -> None:
        memory.recording.record(("event", event), memory.stream_agent(stream))

    @staticmethod
    def on_event_wait(memory: GpuMemory, event: int, stream: int) -> None:
        memory.recording.wait(("event", event), memory.stream_agent(stream))

    @staticmethod
    def on_event_synchronization(memory: GpuMemory, event: int) -> None:
        memory.recording.sync_event(("event", event))

    @staticmethod
    def on_stream_synchronization(memory: GpuMemory, stream: int) -> None:
        memory.recording.sync_stream(memory.stream_agent(stream))

    @staticmethod
    def on_device_synchronization(memory: GpuMemory) -> None:
        memory.recording.sync_device()


def _register_hooks() -> None:
    """Register the trace callbacks once per process and switch the trace on."""
    if _HOOKS_REGISTERED:
        return
    trace = torch.cuda._gpu_trace
    trace.register_callback_for_stream_creation(_forward("on_stream_creation"))
    trace.register_callback_for_event_record(_forward("on_event_record"))
    trace.register_callback_for_event_wait(_forward("on_event_wait"))
    trace.register_callback_for_event_synchronization(_forward("on_event_synchronization"))
    trace.register_callback_for_stream_synchronization(_forward("on_stream_synchronization"))
    trace.register_callback_for_device_synchronization(_forward("on_device_synchronization"))
    torch._C._activate_gpu_trace()
    _HOOKS_REGISTERED.append(True)


def _observing_query(original: Any, captured: Any) -> Any:
    def query(self: Any) -> bool:
        done = original(self)
        if done and _ACTIVE:
            recording = _ACTIVE[-1].recording
            op = captured(self)
            if op is not None:
                recording.observe(op, "query")
        return done
    return query


@contextmanager
def traced(recording: Recording, memory: GpuMemory) -> Iterator[None]:
    """Forward the GPU trace and ``query()`` answers to ``memory``'s recording inside."""
    _register_hooks()
    event_cls, stream_cls = torch.cuda.Event, torch.cuda.Stream
    saved = (event_cls.query, stream_cls.query)
    event_cls.query = _observing_query(
        saved[0], lambda ev: recording.detector.event_op(("event", ev.cuda_event)))
    stream_cls.query = _observing_query(
        saved[1], lambda st: recording.detector.last_op(memory.stream_agent(st.cuda_stream)))
    memory.current_agent()  # the default stream is agent 1, as in CPU mode
    _ACTIVE.append(memory)
    try:
        yield
    finally:
        _ACTIVE.pop()
        event_cls.query, stream_cls.query = saved


class DataPtrMode(TorchFunctionMode):
    """Notices kernels the dispatcher cannot see: ``data_ptr()`` of a CUDA tensor outside a
    declared kernel is an op of unknown access."""

    def __init__(self, memory: GpuMemory, dispatch: Any) -> None:
        super().__init__()
        self.memory = memory
        self.dispatch = dispatch

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if (getattr(func, "__name__", "") == "data_ptr" and args
                and isinstance(args[0], torch.Tensor) and args[0].is_cuda
                and not (self.dispatch.quiet or self.dispatch.paused)):
            info = self.memory.lookup(args[0])
            if info is not None:
                self.memory.recording.unknown("data_ptr", self.memory.current_agent(),
                                              [info.name])
        return func(*args, **kwargs)
