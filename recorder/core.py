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

Times are not measured: nodes carry no times (races are reported with ``manifest=None``), and
the timeline the reports draw spaces nodes evenly in issue order.

Queries. ``query()`` answers False the first time it is asked about a given record (the
outcome that orders nothing, the simulator's default) and True when asked again, as an
observation (a poll loop ends on its second probe, ordered like a synchronize).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from overlap_harness.model.allocator import BlockPool, FreedBlock, pending_ops
from overlap_harness.model.detector import HOST_AGENT, AccessReq, HBDetector, NodeInfo
from overlap_harness.model.trace import DeviceRun, OpId, OpKind, OpRecord, Race
from overlap_harness.recorder.sites import user_site

NODE_SPACING_NS = 1000  # the drawn timeline: one node per microsecond, in issue order
STREAM_OP_NS = 800  # how long a stream op is drawn


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


class Recording:
    """Streams, storages and the detector of one watched run."""

    def __init__(self) -> None:
        self.detector = HBDetector()
        self.pool = BlockPool()
        self.timeline: list[OpRecord] = []
        self.unknown_ops: list[UnknownOp] = []
        self.storages: dict[int, StorageInfo] = {}  # memory key (data_ptr) -> info
        self.buffer_sites: dict[str, str] = {}  # buffer name -> allocation site
        self._agents: dict[object, int] = {}  # stream key -> detector agent
        self._next_storage = 0
        self._next_buffer = 0
        self._queried: set[OpId] = set()  # records a query() already answered False for
        self._sync_keys = 0
        self.ops_recorded = 0
        self.iteration = -1  # the program's loop iteration, set by Watch.iteration

    # -- streams ---------------------------------------------------------------------------
    def agent(self, stream_key: object, name: str) -> int:
        """The detector agent of a stream, registered on first use."""
        agent = self._agents.get(stream_key)
        if agent is None:
            agent = self.detector.add_agent(name)
            self._agents[stream_key] = agent
        return agent

    def _node(self, name: str, agent: int, kind: OpKind, site: str | None) -> NodeInfo:
        op = OpId(len(self.detector.nodes))
        source = site if site is not None else user_site()
        agent_name = self.detector.agent_names[agent]
        start = op * NODE_SPACING_NS
        end = start + (STREAM_OP_NS if agent != HOST_AGENT else 0)
        self.timeline.append(OpRecord(op, name, agent_name, kind, start, start, end,
                                      iteration=self.iteration, source=source))
        return NodeInfo(op, name, agent, agent_name, kind, self.iteration, source, None, None,
                        None)

    # -- nodes -----------------------------------------------------------------------------
    def op(self, name: str, agent: int, accesses: Sequence[Access], kind: OpKind,
           joins: Sequence[OpId] = (), site: str | None = None) -> OpId:
        """Issue one node on ``agent`` with its accesses; returns its id."""
        info = self._node(name, agent, kind, site)
        reqs = [AccessReq(a.info.storage, a.info.buffer_id, a.info.name, a.elements, a.write,
                          a.info.pinned) for a in _merged(accesses)]
        self.detector.on_op(info, reqs, joins)
        self.ops_recorded += 1
        return info.op

    def host_sync(self, name: str, joins: Sequence[OpId | None]) -> OpId:
        """The host blocks until ``joins`` complete (a synchronize, a blocking copy)."""
        done = [j for j in joins if j is not None]
        return self.op(name, HOST_AGENT, (), OpKind.HOST_SYNC, done)

    def sync_stream(self, agent: int) -> OpId:
        """``stream.synchronize()``: the host waits for the stream's last op."""
        return self.host_sync("stream.synchronize", [self.detector.last_op(agent)])

    def sync_device(self) -> OpId:
        """``torch.cuda.synchronize()``: the host waits for every stream's last op."""
        lasts = [self.detector.last_op(a) for a in range(1, len(self.detector.agent_names))]
        return self.host_sync("cuda.synchronize", lasts)

    def record(self, event_key: object, agent: int, name: str = "event.record") -> OpId:
        """``event.record(stream)``: the event captures the stream's work so far."""
        info = self._node(name, agent, OpKind.RECORD, None)
        self.detector.on_record(event_key, info)
        return info.op

    def wait(self, event_key: object, agent: int, name: str = "wait_event") -> OpId:
        """``stream.wait_event(event)``: binds to the latest record; no-op if never recorded."""
        info = self._node(name, agent, OpKind.WAIT, None)
        self.detector.on_wait(event_key, info)
        return info.op

    def wait_stream(self, waiting: int, other: int) -> None:
        """``waiting.wait_stream(other)`` = record a fresh event on ``other``, wait on it."""
        self._sync_keys += 1
        key = ("wait_stream", self._sync_keys)
        self.record(key, other, "wait_stream.record")
        self.wait(key, waiting, "wait_stream")

    def sync_event(self, event_key: object) -> OpId:
        """``event.synchronize()``: the host waits for the record the event captures."""
        return self.host_sync("event.synchronize", [self.detector.event_op(event_key)])

    def query(self, captured: OpId | None, name: str) -> bool:
        """A ``query()`` of work ending at ``captured``: False the first time for it, True
        (an observation: a node that the captured work happens before) when asked again."""
        if captured is None or self.detector.host_knows(captured):
            return True
        if self.first_probe(captured):
            return False
        self.observe(captured, name)
        return True

    def first_probe(self, captured: OpId) -> bool:
        """True (and remembered) the first time a query asks about ``captured``: the probe
        that answers False, in both modes."""
        if captured in self._queried:
            return False
        self._queried.add(captured)
        return True

    def observe(self, captured: OpId, name: str) -> None:
        """The host saw ``captured`` complete (a ``query()`` that returned True)."""
        info = self._node(name, HOST_AGENT, OpKind.QUERY, None)
        self.detector.on_op(info, (), (), observed=(captured,))

    def unknown(self, name: str, agent: int, tensors: Sequence[str]) -> OpId:
        """An op whose accesses nobody declared: a node with none, listed as unknown."""
        op = self.op(name, agent, (), OpKind.KERNEL)
        self.unknown_ops.append(UnknownOp(op, name, self.detector.agent_names[agent],
                                          self.timeline[op].source, tuple(tensors)))
        return op

    # -- memory ----------------------------------------------------------------------------
    def allocate(self, key: int, numel: int, itemsize: int, dtype: Any, shape: tuple[int, ...],
                 pinned: bool, agent: int, alive: Any, label: str) -> StorageInfo:
        """A new storage at memory ``key``: reuse a pooled block when HB allows, else a new
        detector storage. ``label`` names the tensor (``variable@file:line``)."""
        self.sweep()
        pool_key = (numel, str(dtype), pinned, HOST_AGENT if pinned else agent)
        block = self.pool.take(pool_key, self.detector.host_knows)
        if block is None:
            storage = self._next_storage
            self._next_storage += 1
            self.detector.add_storage(storage, numel, shape)
        else:
            storage = block.storage
        self._next_buffer += 1
        site = user_site()
        info = StorageInfo(storage, self._next_buffer, label, numel, itemsize, dtype, pinned,
                           HOST_AGENT if pinned else agent, site, alive)
        self.storages[key] = info
        self.buffer_sites[label] = site
        return info

    def record_stream(self, info: StorageInfo, agent: int) -> None:
        """``tensor.record_stream(stream)``: the block waits for that stream at its free."""
        if agent != info.alloc_agent:
            info.recorded_agents.add(agent)

    def sweep(self) -> None:
        """Return the blocks of every storage that died to the pool (their frees)."""
        dead = [k for k, info in self.storages.items() if not info.alive()]
        for key in dead:
            self.free(key)

    def free(self, key: int) -> None:
        """The storage at ``key`` is gone: its block goes back to the pool, waiting for the
        last op of every stream ``record_stream`` named."""
        info = self.storages.pop(key)
        pending = pending_ops(info.recorded_agents, info.alloc_agent, self.detector.last_op)
        pool_key = (info.numel, str(info.dtype), info.pinned, info.alloc_agent)
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
