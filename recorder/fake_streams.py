"""CPU mode's ``torch.cuda``: streams, events and syncs that feed a recording.

On a CPU-only build ``torch.cuda.Stream`` and ``Event`` cannot even be built, and the lazy
init raises. While a watch runs in CPU mode, :func:`cuda_patches` replaces them (and
``current_stream``, ``stream``, ``set_stream``, ``synchronize``, ``_sleep``,
``is_available``...) with the classes here: each call becomes a node of the recording (a
record, a wait, a host sync) and nothing runs, since CPU mode computes every value in issue
order. The patches are listed once and undone by the caller, also on an exception.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Recording
from overlap_harness.recorder.iterations import untraced
from overlap_harness.recorder.names import variable_here
from overlap_harness.recorder.per_thread import PerThread

FAKE_DEVICE_NAME = "fake CUDA device (overlap-harness CPU mode)"


class CudaState:
    """The faked device: the recording, the default and current streams (the current stream
    is each thread's own and starts as the default stream, as torch's does)."""

    current = PerThread(lambda cuda: cuda.default)

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self._stream_ids = itertools.count(1)
        self.default = FakeStream.__new__(FakeStream)
        self.default._setup(self, 0, "default")
        self.current = self.default

    def agent(self, stream: FakeStream | None) -> int:
        """The detector agent of ``stream`` (the current stream for None)."""
        stream = self.current if stream is None else stream
        return self.recording.agent(stream.stream_id, stream.name)

    def new_stream_id(self) -> int:
        return next(self._stream_ids)


_STATE: list[CudaState] = []  # the active faked device (one at a time)


def state() -> CudaState:
    """The active faked device; an error outside a CPU-mode watch."""
    if not _STATE:
        raise RuntimeError("torch.cuda is faked only inside overlap_harness.watch(mode='cpu')")
    return _STATE[-1]


def current_state() -> CudaState | None:
    """The active faked device, or None outside a CPU-mode watch."""
    return _STATE[-1] if _STATE else None


class FakeStream:
    """``torch.cuda.Stream`` in CPU mode: an agent of the detector, named after the variable
    the program assigns it to (``copy_stream``), else ``streamN``."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        cuda = state()
        number = cuda.new_stream_id()
        name = variable_here() or f"stream{number}"
        self._setup(cuda, number, name)
        self.priority = priority

    def _setup(self, cuda: CudaState, number: int, name: str) -> None:
        self._cuda = cuda
        self.stream_id = number
        self.name = name
        self.device = torch.device("cuda", 0)
        self.device_index = 0
        self.priority = 0
        self.cuda_stream = number

    @property
    def agent(self) -> int:
        return self._cuda.agent(self)

    @untraced
    def wait_event(self, event: FakeEvent) -> None:
        """Later work on this stream waits for the event's latest record."""
        event.wait(self)

    @untraced
    def wait_stream(self, stream: FakeStream) -> None:
        """Later work on this stream waits for ``stream``'s work so far."""
        self._cuda.recording.wait_stream(self.agent, stream.agent)

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        """Record ``event`` (a new one if None) on this stream."""
        event = FakeEvent() if event is None else event
        event.record(self)
        return event

    @untraced
    def synchronize(self) -> None:
        """The host waits for this stream's work."""
        self._cuda.recording.sync_stream(self.agent)

    @untraced
    def query(self) -> bool:
        """See :meth:`recorder.core.Recording.query`."""
        recording = self._cuda.recording
        return recording.query(recording.detector.last_op(self.agent), "stream.query")

    def __enter__(self) -> FakeStream:
        self._previous = self._cuda.current
        self._cuda.current = self
        return self

    def __exit__(self, *exc: object) -> None:
        self._cuda.current = self._previous

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream {self.name} (faked on CPU)>"


class FakeEvent:
    """``torch.cuda.Event`` in CPU mode: records and waits of the detector."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self._cuda = state()
        self.enable_timing = enable_timing
        self.name = variable_here() or "event"

    @untraced
    def record(self, stream: FakeStream | None = None) -> None:
        """Capture ``stream``'s (the current stream's) work so far."""
        self._cuda.recording.record(self, self._cuda.agent(stream), f"{self.name}.record")

    @untraced
    def wait(self, stream: FakeStream | None = None) -> None:
        """Make later work on ``stream`` wait for the latest record (no-op if none)."""
        self._cuda.recording.wait(self, self._cuda.agent(stream), f"wait {self.name}")

    @untraced
    def query(self) -> bool:
        """See :meth:`recorder.core.Recording.query`."""
        recording = self._cuda.recording
        return recording.query(recording.detector.event_op(self), f"{self.name}.query")

    @untraced
    def synchronize(self) -> None:
        """The host waits for the latest record."""
        self._cuda.recording.sync_event(self)

    def elapsed_time(self, end_event: FakeEvent) -> float:
        """Milliseconds between two records: CPU mode measures nothing, so the issue-order
        distance, one microsecond per node (like the drawn timeline)."""
        detector = self._cuda.recording.detector
        start, end = detector.event_op(self), detector.event_op(end_event)
        if start is None or end is None:
            raise RuntimeError("elapsed_time: both events must be recorded")
        return (end - start) / 1000.0

    def __repr__(self) -> str:
        return f"<torch.cuda.Event {self.name} (faked on CPU)>"


class _StreamContext:
    """``torch.cuda.StreamContext`` (and what ``torch.cuda.stream(s)`` returns): ``s`` is the
    current stream inside; None changes nothing. Like torch's, one object may be entered many
    times and nested (SGLang makes ``forward_stream_ctx`` once and enters it every
    iteration), so each entry keeps its own previous stream on a stack."""

    def __init__(self, stream: FakeStream | None) -> None:
        self.stream = stream
        self._previous: list[FakeStream] = []

    def __enter__(self) -> FakeStream | None:
        if self.stream is None:
            return None
        cuda = state()
        self._previous.append(cuda.current)
        cuda.current = self.stream
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is None:
            return
        state().current = self._previous.pop()


def _set_stream(stream: FakeStream) -> None:
    state().current = stream


def _current_stream(device: Any = None) -> FakeStream:
    return state().current


def _default_stream(device: Any = None) -> FakeStream:
    return state().default


@untraced
def _synchronize(device: Any = None) -> None:
    state().recording.sync_device()


def _sleep(cycles: int) -> None:
    cuda = state()
    cuda.recording.op("_sleep", cuda.agent(None), (), OpKind.KERNEL)


def _ignoring(name: str) -> Any:
    """A ``torch.cuda`` call with no effect on streams or values in CPU mode (one function
    object per name: torch._dynamo refuses one object under two names of torch)."""
    def ignore(*args: Any, **kwargs: Any) -> None:
        return None
    ignore.__name__ = ignore.__qualname__ = name
    return ignore


class _NoDevice:
    """``torch.cuda.device(i)`` and ``nvtx.range(...)``: a context that changes nothing
    (CPU mode has one device)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class _NoRange(_NoDevice):
    """``torch.cuda.nvtx.range(...)``: a context that records nothing."""


class _Properties:
    name = FAKE_DEVICE_NAME
    major, minor = 9, 0
    total_memory = 80 * 2**30
    multi_processor_count = 132


def cuda_patches() -> list[tuple[Any, str, Any]]:
    """``(object, attribute, replacement)`` for every ``torch.cuda`` name CPU mode fakes."""
    cuda = torch.cuda
    replacements: dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "get_device_name": lambda device=None: FAKE_DEVICE_NAME,
        "get_device_capability": lambda device=None: (9, 0),
        "get_device_properties": lambda device=None: _Properties(),
        "_lazy_init": lambda: None,
        "init": lambda: None,
        "is_initialized": lambda: True,
        "synchronize": _synchronize,
        "current_stream": _current_stream,
        "default_stream": _default_stream,
        "set_stream": _set_stream,
        "stream": _StreamContext,
        "StreamContext": _StreamContext,
        "Stream": FakeStream,
        "Event": FakeEvent,
        "_sleep": _sleep,
    }
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state",
                 "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
        replacements[name] = _ignoring(name)  # random streams, memory stats: CPU mode has none
    replacements["get_rng_state"] = lambda device=None: torch.get_rng_state()
    replacements["mem_get_info"] = lambda device=None: (_Properties.total_memory,) * 2
    replacements["device"] = _NoDevice
    patches = [(cuda, name, value) for name, value in replacements.items()]
    patches += [(cuda.nvtx, name, _ignoring(name)) for name in ("range_push", "range_pop", "mark")]
    patches += [(cuda.nvtx, "range", _NoRange)]
    patches += [(cuda.streams, "Stream", FakeStream), (cuda.streams, "Event", FakeEvent)]
    return patches


@contextmanager
def active(cuda: CudaState) -> Iterator[CudaState]:
    """Make ``cuda`` the faked device inside the block."""
    _STATE.append(cuda)
    try:
        yield cuda
    finally:
        _STATE.pop()
