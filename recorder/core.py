"""The recording: what a watched program did on its streams, fed to the race detector.

Both modes (CPU, with CUDA faked; GPU, on real streams) turn what the program does into calls
on :class:`Recording`: a device op on a stream with its element sets, a host access of pinned
memory, an event record or wait, a host sync, a query, an allocation, a ``record_stream``.
Each becomes a node of :class:`model.detector.HBDetector` in host issue order, so a watched
program is checked by the same rules as a simulated scenario (STREAM-SEMANTICS.md).

Memory. A storage the program allocates on the device (or pins) gets a detector storage id
through :class:`model.allocator.BlockPool`: when a storage dies (its last tensor is gone), its
block goes back to the pool with the last op of every stream ``record_stream`` named; a new
allocation of the same key (numel, dtype, pinned, allocating stream) takes the block back as
soon as happens-before allows, under the same storage id and a new buffer id, so the detector
reports the new owner's accesses that race with the old owner's as *reuse*. The real memory
behind a storage (CPU memory in CPU mode, the real caching allocator's block on a GPU) plays
no part in that choice, so both modes make the same one.

CUDA graphs. While a capture is under way (:attr:`Recording.capture`, a
:class:`recorder.graphs.GraphCapture`), the nodes issued on its capturing streams go into its
template instead of the detector, and their allocations into the graph's private pool; a
host sync that would wait for captured work fails as it does on a GPU.

Times are not measured: nodes carry no times (races are reported with ``manifest=None``), and
the timeline the reports draw spaces nodes evenly in issue order.

Queries. ``query()`` answers False the first time it is asked about a given record (the
outcome that orders nothing, the simulator's default) and True when asked again, as an
observation (a poll loop ends on its second probe, ordered like a synchronize).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Protocol, TypeVar

import numpy as np

from overlap_harness.model.allocator import BlockPool, FreedBlock, pending_ops
from overlap_harness.model.detector import HOST_AGENT, AccessReq, HBDetector, NodeInfo
from overlap_harness.model.trace import DeviceRun, OpId, OpKind, OpRecord, Race
from overlap_harness.recorder.iterations import IterationMarks
from overlap_harness.recorder.sites import user_site

NODE_SPACING_NS = 1000  # the drawn timeline: one node per microsecond, in issue order
STREAM_OP_NS = 800  # how long a stream op is drawn
#: called as ``observer(recording, op)`` with each new node, on the issuing thread inside the
#: call that issued it (so the caller's stack is the op's stack): a tool that wants more than
#: the innermost user site (the pull-request view keeps each op's call stack) appends one
NODE_OBSERVERS: list[Callable[[Recording, OpId], None]] = []
CAPTURED = OpId(-1)  # what a node issued into a CUDA graph capture returns: it ran nowhere


@dataclass(slots=True)
class StorageInfo:
    """One watched storage (device memory or pinned host memory).

    Args:
        storage: the detector's storage id (shared by every owner of one block).
        buffer_id: this allocation's identity (a reuse gets a new one).
        name: the tensor's name in reports: ``variable@file:line`` of the allocation.
        numel: elements of ``itemsize`` bytes in the storage.
        pinned: pinned host memory (host accesses are checked against copies).
        alloc_agent: the stream it was allocated on (the host for pinned memory).
        alive: a callable returning False once the storage is gone (a weak reference).
        key: the memory key it is registered under (its data pointer).
    """

    storage: int
    buffer_id: int
    name: str
    numel: int
    itemsize: int
    dtype: Any
    pinned: bool
    alloc_agent: int
    alloc_site: str
    alive: Any
    recorded_agents: set[int] = field(default_factory=set)
    graph_pool: Any = None  # the private pool of the CUDA graph capture that allocated it
    key: int = -1


@dataclass(frozen=True, slots=True)
class UnknownOp:
    """An op the recorder saw touch device memory without knowing its reads and writes."""

    op: OpId
    name: str
    stream: str
    site: str
    tensors: tuple[str, ...]


@dataclass(slots=True)
class Access:
    """One access of a node before it is handed to the detector."""

    info: StorageInfo
    elements: np.ndarray
    write: bool


@dataclass(frozen=True, slots=True)
class Replayable:
    """How CPU mode redoes a captured op at each replay of its CUDA graph: ``values()``
    recomputes what it writes; ``accesses()`` gives its accesses from the index values of the
    moment (None: the captured accesses hold, no index involved)."""

    values: Callable[[], object]
    accesses: Callable[[], list[Access]] | None = None


class CaptureSink(Protocol):
    """A CUDA graph capture in progress (:class:`recorder.graphs.GraphCapture`): the nodes
    issued on its streams go into its template instead of the detector."""

    def takes(self, agent: int) -> bool:
        """True when ``agent`` (a stream) is capturing."""
        ...

    def pool_tag(self, agent: int) -> object | None:
        """The graph's private pool for an allocation on ``agent`` (None: not capturing)."""
        ...

    def op(self, name: str, agent: int, accesses: Sequence[Access], kind: OpKind, site: str,
           replay: Replayable | None) -> None:
        """An op issued on a capturing stream."""
        ...

    def record(self, event_key: object, agent: int, name: str) -> bool:
        """An event record: True when captured (``agent`` is capturing)."""
        ...

    def wait(self, event_key: object, agent: int, name: str) -> bool:
        """An event wait: True when captured (``agent`` is capturing, or joins the capture by
        waiting on a captured record)."""
        ...


def _refuse_during_capture(what: str) -> None:
    """A host sync with a capture under way fails on a GPU; it fails alike here."""
    raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({what} "
                       "during a CUDA graph capture)")
_Method = TypeVar("_Method", bound=Callable[..., Any])


def _serialized(method: _Method) -> _Method:
    """One thread at a time feeds the detector (node ids are dense, in issue order), with the
    calling thread's host agent as the issuer (:attr:`Recording.issuing`)."""
    @functools.wraps(method)
    def run(self: Recording, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.detector.issuer = self.issuing()
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


class Recording:
    """Streams, storages and the detector of one watched run.

    Host threads: every method runs under one lock, for the calling Python thread, whose host
    agent :attr:`issuing` names (the detector's host, agent 0, for the thread that entered the
    watch; :mod:`recorder.threads` gives every other thread its own). ``HOST_AGENT`` passed to
    a method means "the calling thread's host agent".
    """

    def __init__(self) -> None:
        self.detector = HBDetector()
        self.pool = BlockPool()
        self.timeline: list[OpRecord] = []
        # (record op, wait op): what each wait joined, for the reports' record -> wait arrows
        self.wait_bindings: list[tuple[OpId, OpId]] = []
        self.unknown_ops: list[UnknownOp] = []
        self.refused: list[str] = []  # what the program reached that is not modelled
        self.marks = IterationMarks()  # the loop iteration each node was issued in
        self.notes: list[Any] = []  # portability notes (recorder.pageable.PortabilityNote)
        self.storages: dict[int, StorageInfo] = {}  # memory key (data_ptr) -> info
        # the sweep's fast path: per key of ``storages`` (same order), the argument of the
        # torch weak-reference check its ``alive`` test makes (see :meth:`sweep`), and the
        # keys whose test is another callable
        self._weak_cdata: dict[int, int] = {}
        self._expired: Callable[[int], bool] | None = None
        self._opaque_alive: set[int] = set()
        self.buffer_sites: dict[str, str] = {}  # buffer name -> allocation site
        self._agents: dict[object, int] = {}  # stream key -> detector agent
        self._next_storage = 0
        self._next_buffer = 0
        self._queried: set[OpId] = set()  # records a query() already answered False for
        self._sync_keys = 0
        self.ops_recorded = 0
        self.capture: CaptureSink | None = None  # a CUDA graph capture under way
        self._lock = threading.RLock()
        self.owner = threading.get_ident()  # the thread that watches
        self.wake_signal: int | None = None  # how a refusing thread wakes it (unmodelled.py)
        self.issuing: Callable[[], int] = lambda: HOST_AGENT  # the calling thread's host
        self.stream_issued: Callable[[int], None] = lambda agent: None  # a stream node issued
        self.iteration = -1  # the program's loop iteration, set by Watch.iteration

    # -- streams ---------------------------------------------------------------------------
    @_serialized
    def agent(self, stream_key: object, name: str) -> int:
        """The detector agent of a stream, registered on first use."""
        agent = self._agents.get(stream_key)
        if agent is None:
            agent = self.detector.add_agent(name)
            self._agents[stream_key] = agent
        return agent

    def _node(self, name: str, agent: int, kind: OpKind, site: str | None) -> NodeInfo:
        detector = self.detector
        if agent == HOST_AGENT:
            agent = detector.issuer
        else:
            self.stream_issued(agent)
            if detector.issuer != HOST_AGENT:  # a stream op of another thread names it
                name = f"{name} [{detector.agent_names[detector.issuer]}]"
        op = OpId(len(detector.nodes))
        source = site if site is not None else user_site()
        agent_name = detector.agent_names[agent]
        start = op * NODE_SPACING_NS
        end = start + (0 if detector.is_host(agent) else STREAM_OP_NS)
        self.timeline.append(OpRecord(op, name, agent_name, kind, start, start, end,
                                      iteration=self.iteration, source=source))
        self.marks.note(op)
        for observe in NODE_OBSERVERS:
            observe(self, op)
        return NodeInfo(op, name, agent, agent_name, kind, self.iteration, source, None, None,
                        None)

    # -- nodes -----------------------------------------------------------------------------
    @_serialized
    def op(self, name: str, agent: int, accesses: Sequence[Access], kind: OpKind,
           joins: Sequence[OpId] = (), site: str | None = None,
           replay: Replayable | None = None) -> OpId:
        """Issue one node on ``agent`` with its accesses; returns its id (:data:`CAPTURED`
        for an op a CUDA graph capture takes, with ``replay`` for CPU mode's replays)."""
        if self.capture is not None and self.capture.takes(agent):
            self.capture.op(name, agent, accesses, kind,
                            site if site is not None else user_site(), replay)
            return CAPTURED
        info = self._node(name, agent, kind, site)
        reqs = [AccessReq(a.info.storage, a.info.buffer_id, a.info.name, a.elements, a.write,
                          a.info.pinned) for a in _merged(accesses)]
        self.detector.on_op(info, reqs, joins)
        if kind == OpKind.WAIT:  # a graph replay ordered after its previous replay
            self.wait_bindings.extend((joined, info.op) for joined in joins)
        self.ops_recorded += 1
        return info.op

    @_serialized
    def host_sync(self, name: str, joins: Sequence[OpId | None]) -> OpId:
        """The host blocks until ``joins`` complete (a synchronize, a blocking copy)."""
        if CAPTURED in joins:
            _refuse_during_capture(name)
        done = [j for j in joins if j is not None]
        return self.op(name, HOST_AGENT, (), OpKind.HOST_SYNC, done)

    @_serialized
    def sync_stream(self, agent: int) -> OpId:
        """``stream.synchronize()``: the host waits for the stream's last op."""
        if self.capture is not None and self.capture.takes(agent):
            _refuse_during_capture("stream.synchronize")
        return self.host_sync("stream.synchronize", [self.detector.last_op(agent)])

    @_serialized
    def sync_device(self) -> OpId:
        """``torch.cuda.synchronize()``: the host waits for every stream's last op."""
        if self.capture is not None:
            _refuse_during_capture("cuda.synchronize")
        detector = self.detector
        lasts = [detector.last_op(a) for a in range(len(detector.agent_names))
                 if not detector.is_host(a)]
        return self.host_sync("cuda.synchronize", lasts)

    @_serialized
    def record(self, event_key: object, agent: int, name: str = "event.record") -> OpId:
        """``event.record(stream)``: the event captures the stream's work so far."""
        if self.capture is not None and self.capture.record(event_key, agent, name):
            return CAPTURED
        info = self._node(name, agent, OpKind.RECORD, None)
        self.detector.on_record(event_key, info)
        return info.op

    @_serialized
    def wait(self, event_key: object, agent: int, name: str = "wait_event") -> OpId:
        """``stream.wait_event(event)``: binds to the latest record; no-op if never recorded."""
        if self.capture is not None and self.capture.wait(event_key, agent, name):
            return CAPTURED
        bound = self.detector.event_op(event_key)
        info = self._node(name, agent, OpKind.WAIT, None)
        self.detector.on_wait(event_key, info)
        if bound is not None:
            self.wait_bindings.append((bound, info.op))
        return info.op

    @_serialized
    def wait_stream(self, waiting: int, other: int) -> None:
        """``waiting.wait_stream(other)`` = record a fresh event on ``other``, wait on it."""
        self._sync_keys += 1
        key = ("wait_stream", self._sync_keys)
        self.record(key, other, "wait_stream.record")
        self.wait(key, waiting, "wait_stream")

    @_serialized
    def sync_event(self, event_key: object) -> OpId:
        """``event.synchronize()``: the host waits for the record the event captures."""
        return self.host_sync("event.synchronize", [self.detector.event_op(event_key)])

    @_serialized
    def query(self, captured: OpId | None, name: str,
              device_answer: Callable[[], bool] | None = None) -> bool:
        """A ``query()`` of work ending at ``captured``, answered alike in both modes: False
        the first time it is asked about a record the host does not know complete (a
        possible answer of a non-blocking probe under some timing), else ``device_answer()``
        (True in CPU mode, where nothing runs), a True one recorded as an observation (a node
        that the captured work happens before)."""
        if captured is None or self.detector.host_knows(captured):
            return True if device_answer is None else device_answer()
        if self.first_probe(captured):
            return False
        done = True if device_answer is None else device_answer()
        if done:
            self.observe(captured, name)
        return done

    @_serialized
    def first_probe(self, captured: OpId) -> bool:
        """True (and remembered) the first time a query asks about ``captured``: the probe
        that answers False, in both modes."""
        if captured in self._queried:
            return False
        self._queried.add(captured)
        return True

    @_serialized
    def observe(self, captured: OpId, name: str) -> None:
        """The host saw ``captured`` complete (a ``query()`` that returned True)."""
        info = self._node(name, HOST_AGENT, OpKind.QUERY, None)
        self.detector.on_op(info, (), (), observed=(captured,))

    @_serialized
    def unknown(self, name: str, agent: int, tensors: Sequence[str],
                site: str | None = None) -> OpId:
        """An op whose accesses nobody declared: a node with none, listed as unknown (at
        ``site``, else the caller's)."""
        op = self.op(name, agent, (), OpKind.KERNEL, site=site)
        site = (site or user_site()) if op == CAPTURED else self.timeline[op].source
        self.unknown_ops.append(UnknownOp(op, name, self.detector.agent_names[agent], site,
                                          tuple(tensors)))
        return op

    # -- memory ----------------------------------------------------------------------------
    @_serialized
    def allocate(self, key: int, numel: int, itemsize: int, dtype: Any, shape: tuple[int, ...],
                 pinned: bool, agent: int, alive: Any, label: str,
                 site: str | None = None) -> StorageInfo:
        """A new storage at memory ``key``: reuse a pooled block when HB allows, else a new
        detector storage. ``label`` names the tensor (``variable@file:line``); ``site`` is
        the user's line that allocates it (None: the innermost user frame, found here)."""
        self.sweep()
        graph_pool = None if self.capture is None or pinned else self.capture.pool_tag(agent)
        pool_key = (numel, str(dtype), pinned, HOST_AGENT if pinned else agent, graph_pool)
        block = self.pool.take(pool_key, self.detector.host_knows)
        if block is None:
            storage = self._next_storage
            self._next_storage += 1
            self.detector.add_storage(storage, numel, shape)
        else:
            storage = block.storage
        self._next_buffer += 1
        if site is None:
            site = user_site()
        info = StorageInfo(storage, self._next_buffer, label, numel, itemsize, dtype, pinned,
                           HOST_AGENT if pinned else agent, site, alive,
                           graph_pool=graph_pool, key=key)
        self.storages[key] = info
        self._note_alive_test(key, alive)
        self.buffer_sites[label] = site
        return info

    @_serialized
    def record_stream(self, info: StorageInfo, agent: int) -> None:
        """``tensor.record_stream(stream)``: the block waits for that stream at its free."""
        if agent != info.alloc_agent:
            info.recorded_agents.add(agent)

    def _note_alive_test(self, key: int, alive: Any) -> None:
        """Keep what :meth:`sweep` needs to ask ``alive`` without calling it: an ``alive``
        made by ``recorder.dispatch.alive_test`` carries torch's weak-reference check
        (``expired``) and its argument (``weak_cdata``)."""
        cdata, expired = getattr(alive, "weak_cdata", None), getattr(alive, "expired", None)
        self._weak_cdata[key] = 0 if cdata is None else cdata
        if cdata is None or (self._expired is not None and expired is not self._expired):
            self._opaque_alive.add(key)
        else:
            self._expired = expired
            self._opaque_alive.discard(key)

    @_serialized
    def sweep(self) -> None:
        """Return the blocks of every storage that died to the pool (their frees), in the
        order the storages were allocated. Asked before every allocation of every storage
        (SGLang's necessity table: 50,000 asks a run), so when every ``alive`` test is a
        torch weak reference the checks run in one ``map`` with no Python frame each."""
        if self._opaque_alive or self._expired is None:
            dead = [k for k, info in self.storages.items() if not info.alive()]
        else:
            dead = list(compress(self._weak_cdata, map(self._expired,
                                                       self._weak_cdata.values())))
        for key in dead:
            self.free(key)

    @_serialized
    def free(self, key: int) -> None:
        """The storage at ``key`` is gone: its block goes back to the pool, waiting for the
        last op of every stream ``record_stream`` named."""
        info = self.storages.pop(key)
        del self._weak_cdata[key]
        self._opaque_alive.discard(key)
        pending = pending_ops(info.recorded_agents, info.alloc_agent, self.detector.last_op)
        pool_key = (info.numel, str(info.dtype), info.pinned, info.alloc_agent, info.graph_pool)
        self.pool.give(FreedBlock(pool_key, None, info.storage, pending))

    # -- results ---------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        """Every race found so far."""
        return self.detector.races

    def device_run(self) -> DeviceRun:
        """The run as the reports read it (timeline spaced in issue order, races)."""
        end = self.timeline[-1].end_ns if self.timeline else 0
        return DeviceRun(timeline=list(self.timeline), races=list(self.detector.races),
                         end_ns=end)



def _merged(accesses: Sequence[Access]) -> list[Access]:
    """One access per (storage, mode): an op that reads a tensor twice (``x * x``) or two
    views of one storage reads it once, so each racing pair is reported once."""
    if len(accesses) < 2:
        return list(accesses)
    merged: dict[tuple[int, bool], Access] = {}
    for access in accesses:
        key = (access.info.buffer_id, access.write)
        prior = merged.get(key)
        if prior is None:
            merged[key] = access
        else:
            merged[key] = Access(access.info, np.union1d(prior.elements, access.elements),
                                 access.write)
    return list(merged.values())
