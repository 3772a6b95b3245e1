"""GPU mode: the same recording on real CUDA streams.

The aten ops come from the same dispatch mode as in CPU mode; streams, events and syncs come
from PyTorch's GPU trace hooks (``torch.cuda._gpu_trace``: event record / wait / sync, stream
and device syncs), which torch calls from C++ for every such action, the feed CSAN is built
on. Streams are named when the program makes them (``torch.cuda.Stream.__new__`` is wrapped
while the watch runs), after the variable they are assigned to. ``query()`` is not traced,
so ``Event.query`` and ``Stream.query`` are wrapped to answer as in CPU mode: False on the
first probe of a record (a possible answer of a non-blocking probe under some timing), then the
device's answer, a True one being an observation of the captured work.

Memory: device storages are keyed by their device pointer and watched through a weak reference,
exactly as in CPU mode, and a storage that existed before the watch began is adopted at its
first use. Block reuse is decided by :class:`model.allocator.BlockPool`, not by the real
caching allocator's addresses, so both modes report the same reuse races.

The trace hooks cannot be unregistered; they are registered once and forward to the recording
of the running watch (none outside one).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Recording, StorageInfo
from overlap_harness.recorder.dispatch import HOST_READS, Placement, access_of, register_storage
from overlap_harness.recorder.host_array_methods import host_array
from overlap_harness.recorder.host_arrays import HostArray
from overlap_harness.recorder.iterations import untraced
from overlap_harness.recorder.names import variable_here
from overlap_harness.recorder.numpy_entry import holds_host_array, torch_arguments
from overlap_harness.recorder.own_work import in_recorder_work
from overlap_harness.recorder.patching import patched
from overlap_harness.recorder.sites import is_user_file

_ACTIVE: list[GpuMemory] = []
_HOOKS_REGISTERED: list[bool] = []


class GpuMemory:
    """Watched CUDA storages (device pointer keys) and pinned host storages."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self.placement = Placement.INFER
        self.stream_names: dict[int, str] = {}
        self._unnamed = 0

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

    def name_stream(self, stream_handle: int) -> None:
        """A stream the program just made: named after the variable it is assigned to."""
        name = variable_here()
        if name is not None:
            self.stream_names[stream_handle] = name

    def stream_agent(self, stream_handle: int) -> int:
        default = torch.cuda.default_stream().cuda_stream
        if stream_handle == default:
            name = "default"
        else:
            name = self.stream_names.get(stream_handle) or f"stream{self._unnamed + 1}"
        agent = self.recording.agent(("cuda", stream_handle), name)
        if name.startswith("stream") and stream_handle not in self.stream_names:
            self.stream_names[stream_handle] = name
            self._unnamed += 1
        return agent

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        info = self.lookup(t)
        if info is None or info.pinned:
            return
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:  # a generic torch.Stream, as the dispatcher hands it over
            handle = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                       device_type=stream.device_type).cuda_stream
        self.recording.record_stream(info, self.stream_agent(handle))

    def current_agent(self) -> int:
        return self.stream_agent(torch.cuda.current_stream().cuda_stream)

    def register(self, t: torch.Tensor, pinned: bool, agent: int, label: str,
                 site: str | None = None) -> StorageInfo:
        return register_storage(self.recording, t, pinned, agent, label, site)


def _forward(handler: str) -> Any:
    def hook(*args: Any) -> None:
        if _ACTIVE and not in_recorder_work():
            getattr(_Hooks, handler)(_ACTIVE[-1], *args)
    return hook


class _Hooks:
    """What each GPU trace callback does to the running recording."""

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


def trace_active() -> bool:
    """True once this process has switched torch's GPU trace on (it stays on: torch has no
    way to switch it off, so a command line leaves without teardown afterwards)."""
    return bool(_HOOKS_REGISTERED)


def _register_hooks() -> None:
    """Register the trace callbacks once per process and switch the trace on."""
    if _HOOKS_REGISTERED:
        return
    import torch.cuda._gpu_trace as trace  # deferred: a submodule torch.cuda does not import

    trace.register_callback_for_event_record(_forward("on_event_record"))
    trace.register_callback_for_event_wait(_forward("on_event_wait"))
    trace.register_callback_for_event_synchronization(_forward("on_event_synchronization"))
    trace.register_callback_for_stream_synchronization(_forward("on_stream_synchronization"))
    trace.register_callback_for_device_synchronization(_forward("on_device_synchronization"))
    torch._C._activate_gpu_trace()
    _HOOKS_REGISTERED.append(True)


def _observing_query(original: Any, captured: Any) -> Any:
    """``query()`` answered by :meth:`recorder.core.Recording.query` (the policy both modes
    share), with the device's answer where the policy asks for one."""
    def query(self: Any) -> bool:
        if not _ACTIVE:
            return original(self)
        return _ACTIVE[-1].recording.query(captured(self), "query", lambda: original(self))
    return query


@contextmanager
def traced(recording: Recording, memory: GpuMemory) -> Iterator[None]:
    """Forward the GPU trace and ``query()`` answers to ``memory``'s recording inside."""
    _register_hooks()
    event_cls, stream_cls = torch.cuda.Event, torch.cuda.Stream
    event_query = _observing_query(
        event_cls.query, lambda ev: recording.detector.event_op(("event", ev.cuda_event)))
    stream_query = _observing_query(
        stream_cls.query,
        lambda st: recording.detector.last_op(memory.stream_agent(st.cuda_stream)))
    memory.current_agent()  # the default stream is agent 1, as in CPU mode
    original_new = vars(stream_cls)["__new__"]

    def named_new(cls: type, *args: Any, **kwargs: Any) -> Any:
        stream = original_new.__func__(cls, *args, **kwargs)
        if is_user_file(sys._getframe(1).f_code.co_filename):  # not current_stream()'s
            memory.name_stream(stream.cuda_stream)
        return stream

    _ACTIVE.append(memory)
    try:
        with patched([(event_cls, "query", event_query), (stream_cls, "query", stream_query),
                      (stream_cls, "__new__", staticmethod(named_new))]):
            yield
    finally:
        _ACTIVE.pop()


class GpuFunctionMode(TorchFunctionMode):
    """What the dispatcher cannot see: ``data_ptr()`` of a CUDA tensor (or of pinned memory)
    outside a declared kernel is an op of unknown access; ``tolist()`` or printing of pinned
    memory is a host read; ``numpy()`` of it is a recorded view (:mod:`recorder.host_arrays`)."""

    def __init__(self, memory: GpuMemory, dispatch: Any) -> None:
        super().__init__()
        self.memory = memory
        self.dispatch = dispatch

    @untraced
    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if ((name == "data_ptr" or name in HOST_READS) and args and self.dispatch.live
                and isinstance(args[0], torch.Tensor)
                and not (self.dispatch.quiet or self.dispatch.paused)):
            info = self.memory.lookup(args[0])
            recording = self.memory.recording
            if info is None:
                pass
            elif name == "data_ptr":  # a raw pointer: of pinned memory, for the host's use
                agent = HOST_AGENT if info.pinned else self.memory.current_agent()
                recording.unknown("data_ptr", agent, [info.name])
            elif name == "numpy" and info.pinned:
                return self.host_view(args[0])  # a view: its reads and writes recorded
            elif name in HOST_READS and info.pinned:
                recording.op(name, HOST_AGENT, [access_of(info, args[0], False)],
                             OpKind.HOST_READ)
        if self.dispatch.live and holds_host_array(args, kwargs):  # NumPy views of pinned
            args, kwargs = torch_arguments(func, args, kwargs)  # memory given to torch
        return func(*args, **kwargs)

    def host_view(self, t: Any) -> HostArray | None:
        """The recorded NumPy view of a watched pinned tensor ``t``, else None; taking it
        reads nothing."""
        info = self.memory.lookup(t) if isinstance(t, torch.Tensor) else None
        if info is None or not info.pinned:
            return None
        dispatch = self.dispatch
        return host_array(self.memory.recording, info, t, lambda: dispatch.live)
