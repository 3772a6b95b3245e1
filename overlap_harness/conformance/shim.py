"""A small CPU-mode recorder, local to the conformance package, used until ``recorder/`` lands.

It records what SGLang's FutureMap does on fake CUDA streams and feeds the project's own
happens-before detector (:class:`model.detector.HBDetector`), so the verdicts use the same
rules as the simulator (STREAM-SEMANTICS.md). It is deliberately narrow: it fakes what
overlap_utils.py of sglang 0.5.23 calls and nothing more.

- ``torch.get_device_module(...)`` returns :class:`FakeCudaModule` (``Stream``, ``Event``,
  ``stream(...)``, ``current_stream``). Streams and events are detector agents and keys; a wait
  binds to the record that is latest when it is issued.
- Every tensor is a CPU tensor. A storage is *device* memory unless registered as host
  (:meth:`Watch.host`) or pinned (a factory called with ``pin_memory=True``, which the shim
  strips and registers). A dispatched aten op that touches device memory is a device op on the
  current stream; one that touches only host memory is a host op, recorded only where it
  touches pinned memory (host reads of the pinned seq_lens mirror).
- Element sets are exact: ``index`` reads and ``index_put_`` writes only the rows their index
  values name (computed by running the same op on a tensor of element ids); every other op
  reads and writes its tensors' views (storage offset, sizes, strides); view ops access nothing.
- ``.cpu()``, ``.tolist()`` and ``_local_scalar_dense`` (``int(t)``, ``.item()``) of device
  memory are blocking reads: a copy on the current stream and a host sync on it.
- :meth:`Watch.declare` records an op whose reads and writes the dispatcher cannot see (the
  Triton gather), and runs it with recording paused.

Not covered (recorder/ owns these): ``record_stream`` and allocator reuse (real code skips
``record_stream`` on CPU tensors), ``.to("cuda")``, ``is_cuda``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model.detector import HOST_AGENT, AccessReq, HBDetector, NodeInfo
from model.trace import OpKind, Race

HOST, DEVICE, PINNED = "host", "device", "pinned"
_SKIP_FILES = ("/torch/", "/contextlib.py", "/conformance/shim.py", "/functools.py")
_SCALAR_OPS = {torch.ops.aten._local_scalar_dense.default}
_INDEX_READ = {torch.ops.aten.index.Tensor}
_INDEX_WRITE = {torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default}


@dataclass(slots=True)
class _Block:
    """One storage the shim knows: its detector id, kind, element count and name."""

    storage_id: int
    kind: str
    numel: int
    name: str


class FakeStream:
    """A CUDA stream as a detector agent."""

    def __init__(self, watch: Watch, name: str) -> None:
        self.watch = watch
        self.name = name
        self.agent = watch.detector.add_agent(name)

    def rename(self, name: str) -> None:
        """Name the stream in reports (SGLang creates its private streams unnamed)."""
        self.name = name
        self.watch.detector.agent_names[self.agent] = name

    def wait_event(self, event: FakeEvent) -> None:
        self.watch.node(self.agent, "wait_event", OpKind.WAIT, wait_key=event)

    def wait_stream(self, other: FakeStream) -> None:
        last = self.watch.detector.last_op(other.agent)
        self.watch.node(self.agent, "wait_stream", OpKind.WAIT,
                        joins=() if last is None else (last,))

    def synchronize(self) -> None:
        last = self.watch.detector.last_op(self.agent)
        self.watch.node(HOST_AGENT, f"{self.name}.synchronize", OpKind.HOST_SYNC,
                        joins=() if last is None else (last,))

    def query(self) -> bool:
        last = self.watch.detector.last_op(self.agent)
        self.watch.node(HOST_AGENT, f"{self.name}.query", OpKind.QUERY,
                        observed=() if last is None else (last,))
        return True


class FakeEvent:
    """A CUDA event as a detector key."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.watch.current
        self.watch.node(stream.agent, "event.record", OpKind.RECORD, record_key=self)

    def wait(self, stream: FakeStream | None = None) -> None:
        (stream or self.watch.current).wait_event(self)

    def synchronize(self) -> None:
        rec = self.watch.detector.event_op(self)
        self.watch.node(HOST_AGENT, "event.synchronize", OpKind.HOST_SYNC,
                        joins=() if rec is None else (rec,))

    def query(self) -> bool:
        rec = self.watch.detector.event_op(self)
        self.watch.node(HOST_AGENT, "event.query", OpKind.QUERY,
                        observed=() if rec is None else (rec,))
        return True


class FakeCudaModule:
    """What ``torch.get_device_module("cuda")`` answers while a watch runs."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch

    def Stream(self, priority: int = 0) -> FakeStream:  # torch.cuda's name
        return self._watch.new_stream()

    def Event(self, **_: Any) -> FakeEvent:  # torch.cuda's name
        return FakeEvent(self._watch)

    def current_stream(self) -> FakeStream:
        return self._watch.current

    @contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        with self._watch.on(stream):
            yield

    StreamContext = stream


@dataclass
class Watch:
    """The state of one recorded run: the detector, the streams, the known storages."""

    detector: HBDetector = field(default_factory=HBDetector)
    blocks: dict[int, _Block] = field(default_factory=dict)  # storage data_ptr -> block
    iteration: int = -1
    default_name: str = "default_stream"
    paused: int = 0
    _stream_count: int = 0
    _storage_ids: int = 0
    freed: list[tuple[_Block, list[int]]] = field(default_factory=list)
    alive: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.current = self.new_stream(self.default_name)
        self.cuda = FakeCudaModule(self)

    @property
    def races(self) -> list[Race]:
        """Every race the detector found, in report order."""
        return self.detector.races

    def new_stream(self, name: str | None = None) -> FakeStream:
        self._stream_count += 1
        return FakeStream(self, name or f"stream{self._stream_count}")

    @contextmanager
    def on(self, stream: FakeStream) -> Iterator[None]:
        """``torch.cuda.stream(stream)``: the current stream for the block."""
        saved, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = saved

    # -- memory ---------------------------------------------------------------------------
    def block(self, tensor: torch.Tensor, kind: str | None = None, name: str = "") -> _Block:
        """The block of ``tensor``'s storage; registers it (as ``kind``) when new."""
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        numel = max(storage.nbytes() // max(tensor.element_size(), 1), 1)
        known = self.blocks.get(key)
        if known is not None and known.numel != numel:
            known = None  # a freed CPU address handed out again to an unseen allocation
        if known is not None and (kind is None or known.kind == kind):
            if name and known.name.startswith("tensor#"):
                known.name = name
            return known
        storage_id = self._next_storage_id()
        blk = _Block(storage_id, kind or DEVICE, numel, name or f"tensor#{storage_id}")
        self.blocks[key] = blk
        self.alive.append(tensor)  # no CPU address is handed out twice while the watch runs
        self.detector.add_storage(storage_id, numel, (numel,))
        return blk

    def _next_storage_id(self) -> int:
        self._storage_ids += 1
        return self._storage_ids

    def free(self, tensor: torch.Tensor, record_streams: Sequence[FakeStream] = ()) -> None:
        """The caching allocator frees ``tensor``'s block. Without ``record_stream`` it can
        be handed out again at once; with it, only once the host knows those streams' work
        at free time has completed (reuse decided by happens-before, STREAM-SEMANTICS.md)."""
        blk = self.block(tensor)
        pending = [op for op in (self.detector.last_op(s.agent) for s in record_streams)
                   if op is not None]
        self.freed.append((blk, pending))

    def allocate(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """A new device allocation of ``tensor``'s size: reuses a freed block of that size
        when the allocator may (see :meth:`free`), else gets a new block; returns tensor."""
        numel = tensor.numel()
        for i, (blk, pending) in enumerate(self.freed):
            if blk.numel == numel and all(self.detector.host_knows(op) for op in pending):
                del self.freed[i]
                blk.name = f"{blk.name}->{name}"
                self.blocks[tensor.untyped_storage().data_ptr()] = blk
                break
        else:
            self.fresh(tensor, DEVICE)
            self.blocks[tensor.untyped_storage().data_ptr()].name = name
        # the H2D copy that fills the new tensor, on the current stream
        self.node(self.current.agent, f"h2d {name}", OpKind.COPY, [self.access(tensor, True)])
        return tensor

    def host(self, tensor: torch.Tensor, name: str = "") -> torch.Tensor:
        """Register ``tensor`` as plain host memory (a ``*_cpu`` field); returns it."""
        self.block(tensor, HOST, name)
        return tensor

    def name(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Give ``tensor``'s storage a readable name in race reports; returns it."""
        self.block(tensor, None, name).name = name
        return tensor

    def fresh(self, tensor: torch.Tensor, kind: str) -> None:
        """A new allocation that may reuse a freed CPU address: a new block, never the old."""
        self.blocks.pop(tensor.untyped_storage().data_ptr(), None)
        self.block(tensor, kind)

    # -- nodes ------------------------------------------------------------------------------
    def node(self, agent: int, name: str, kind: OpKind, accesses: Sequence[AccessReq] = (),
             joins: Sequence[int] = (), observed: Sequence[int] = (),
             record_key: object = None, wait_key: object = None) -> int:
        """Feed one node to the detector; returns its op id."""
        det = self.detector
        info = NodeInfo(op=len(det.nodes), name=name, agent=agent,
                        agent_name=det.agent_names[agent], kind=kind, iteration=self.iteration,
                        source=caller_site(), label=None, start_ns=None, end_ns=None)
        if record_key is not None:
            det.on_record(record_key, info)
        elif wait_key is not None:
            det.on_wait(wait_key, info)
        else:
            det.on_op(info, accesses, joins, observed)
        return info.op

    def access(self, tensor: torch.Tensor, write: bool, elements: np.ndarray | None = None,
               ) -> AccessReq:
        blk = self.block(tensor)
        self.paused += 1  # the element-id arithmetic is the recorder's, not the program's
        try:
            ids = element_ids(tensor) if elements is None else elements
        finally:
            self.paused -= 1
        return AccessReq(blk.storage_id, blk.storage_id, blk.name, ids, write,
                         blk.kind == PINNED)

    def blocking_read(self, tensor: torch.Tensor, name: str) -> None:
        """A D2H copy on the current stream that the host waits for (``.cpu()``, ``int()``)."""
        if self.block(tensor).kind != DEVICE:
            return
        op = self.node(self.current.agent, name, OpKind.COPY, [self.access(tensor, False)])
        self.node(HOST_AGENT, f"{name}.host_sync", OpKind.HOST_SYNC, joins=(op,))

    def declare(self, name: str, fn: Callable[..., Any], reads: Sequence[tuple[torch.Tensor,
                torch.Tensor | None]], *args: Any) -> Any:
        """Run ``fn(*args)`` unseen and record one op on the current stream reading the rows
        ``index`` of each ``(buffer, index)`` in ``reads`` and writing every output tensor."""
        self.paused += 1
        try:
            out = fn(*args)
        finally:
            self.paused -= 1
        self.paused += 1
        try:
            rows = [(t, row_ids(t, idx)) for t, idx in reads if t is not None]
        finally:
            self.paused -= 1
        accs = [self.access(t, False, ids) for t, ids in rows]
        outs = out if isinstance(out, tuple) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor):
                self.fresh(t, DEVICE)
                accs.append(self.access(t, True))
        self.node(self.current.agent, name, OpKind.KERNEL, accs)
        return out


def element_ids(tensor: torch.Tensor) -> np.ndarray:
    """Flat storage element ids a view touches (offset, sizes, strides)."""
    numel = max(tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1), 1)
    ids = torch.arange(numel, dtype=torch.int64)
    view = torch.as_strided(ids, tensor.size(), tensor.stride(), tensor.storage_offset())
    return np.unique(view.reshape(-1).numpy())


def row_ids(tensor: torch.Tensor, index: torch.Tensor | None) -> np.ndarray:
    """Storage element ids of ``tensor[index]`` (all of ``tensor`` when index is None)."""
    if index is None:
        return element_ids(tensor)
    numel = max(tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1), 1)
    ids = torch.arange(numel, dtype=torch.int64)
    view = torch.as_strided(ids, tensor.size(), tensor.stride(), tensor.storage_offset())
    return np.unique(view[index.long()].reshape(-1).numpy())


def caller_site() -> str:
    """``file:line`` of the innermost frame outside torch and this shim (SGLang's own line)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(part in name for part in _SKIP_FILES):
            return f"{_short(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _short(path: str) -> str:
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path


class _RecordingMode(TorchDispatchMode):
    """Every aten op becomes a node: a device op on the current stream when it touches device
    memory, else a host op (recorded only where it touches pinned memory)."""

    def __init__(self, watch: Watch) -> None:
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.watch.paused:
            return out
        self.watch.paused += 1
        try:
            self._record(func, args, kwargs, out)
        finally:
            self.watch.paused -= 1
        return out

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        watch = self.watch
        schema = func._schema
        returns = [r for r in schema.returns]
        inputs: list[tuple[torch.Tensor, bool]] = []  # (tensor, written)
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written = arg.alias_info is not None and arg.alias_info.is_write
            for t in _tensors(value):
                inputs.append((t, written))
        outs = list(_tensors(out))
        if returns and outs and all(r.alias_info is not None and not r.alias_info.is_write
                                    for r in returns):
            return  # a view: no access until something reads or writes through it
        input_ptrs = {t.untyped_storage().data_ptr() for t, _ in inputs}
        kinds = [watch.block(t).kind for t, _ in inputs]
        on_device = DEVICE in kinds
        made_kind = DEVICE if on_device or not inputs else HOST  # a factory makes device memory
        for t in outs:
            if t.untyped_storage().data_ptr() not in input_ptrs:
                watch.fresh(t, made_kind)
        if func in _SCALAR_OPS and on_device:
            watch.blocking_read(inputs[0][0], "item")
            return
        accs = self._accesses(func, args, inputs, outs, input_ptrs)
        if on_device:
            watch.node(watch.current.agent, func.__name__.split(".")[0], OpKind.KERNEL, accs)
            return
        pinned = [a for a in accs if a.pinned]
        if pinned:
            kind = OpKind.HOST_WRITE if any(a.write for a in pinned) else OpKind.HOST_READ
            watch.node(HOST_AGENT, func.__name__.split(".")[0], kind, pinned)

    def _accesses(self, func: Any, args: tuple, inputs: list[tuple[torch.Tensor, bool]],
                  outs: list[torch.Tensor], input_ptrs: set[int]) -> list[AccessReq]:
        watch = self.watch
        accs: list[AccessReq] = []
        if func in _INDEX_READ or func in _INDEX_WRITE:
            target, index = args[0], args[1]
            watch.paused += 1
            try:
                rows = _index_ids(target, index)
            finally:
                watch.paused -= 1
            accs.append(watch.access(target, func in _INDEX_WRITE, rows))
            for t, _ in inputs[1:]:
                accs.append(watch.access(t, False))
            if func in _INDEX_READ:
                accs.extend(watch.access(t, True) for t in outs)
            return accs
        for t, written in inputs:
            accs.append(watch.access(t, written))
        accs.extend(watch.access(t, True) for t in outs
                    if t.untyped_storage().data_ptr() not in input_ptrs)
        return [a for a in accs if watch_kind_matters(a)]


def watch_kind_matters(access: AccessReq) -> bool:
    """Accesses to plain host memory are the host's own business (never racing a stream)."""
    return access.elements.size > 0


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _index_ids(target: torch.Tensor, index: Sequence[torch.Tensor | None]) -> np.ndarray:
    numel = max(target.untyped_storage().nbytes() // max(target.element_size(), 1), 1)
    ids = torch.arange(numel, dtype=torch.int64)
    view = torch.as_strided(ids, target.size(), target.stride(), target.storage_offset())
    return np.unique(view[tuple(index)].reshape(-1).numpy())


_FACTORIES = ("empty", "zeros", "full", "ones")


@contextmanager
def watch(default_stream: str = "schedule_stream") -> Iterator[Watch]:
    """Record everything torch does in the block on fake CUDA streams; ``w.races`` after.

    Patches, for the block only: ``torch.get_device_module`` (the fake CUDA module),
    the factories' ``pin_memory=True`` (stripped, the result registered pinned),
    ``Tensor.cpu`` / ``Tensor.tolist`` (blocking reads of device memory)."""
    state = Watch(default_name=default_stream)
    saved = {name: getattr(torch, name) for name in _FACTORIES}
    saved_module = torch.get_device_module
    saved_cpu, saved_tolist = torch.Tensor.cpu, torch.Tensor.tolist

    def factory(name: str) -> Callable[..., torch.Tensor]:
        real = saved[name]

        def make(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            tensor = real(*args, **kwargs)
            if pin_memory:
                state.fresh(tensor, PINNED)
            return tensor
        return make

    def cpu(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if state.paused or state.block(tensor).kind != DEVICE:
            return saved_cpu(tensor, *args, **kwargs)
        state.blocking_read(tensor, "cpu")
        state.paused += 1
        try:
            copy = tensor.clone()
        finally:
            state.paused -= 1
        state.fresh(copy, HOST)
        return copy

    def tolist(tensor: torch.Tensor) -> Any:
        if not state.paused:
            state.blocking_read(tensor, "tolist")
        return saved_tolist(tensor)

    for name in _FACTORIES:
        setattr(torch, name, factory(name))
    torch.get_device_module = lambda device=None: state.cuda  # type: ignore[assignment]
    torch.Tensor.cpu, torch.Tensor.tolist = cpu, tolist  # type: ignore[method-assign]
    try:
        with _RecordingMode(state):
            yield state
    finally:
        for name, real in saved.items():
            setattr(torch, name, real)
        torch.get_device_module = saved_module
        torch.Tensor.cpu, torch.Tensor.tolist = saved_cpu, saved_tolist  # type: ignore[method-assign]
