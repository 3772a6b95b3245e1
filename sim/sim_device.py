"""SimDevice: the device API on a simpy discrete-event model (STREAM-SEMANTICS.md).

Timing. The host is one sequential agent with its own clock: each issue costs
``host_launch_us``; a host sync advances the host clock to the completion of the synced work.
An op starts at max(issue time, end of the previous op on its stream, completion of every
record waited on before it) and runs for its cost. Every one of those inputs was issued before
the op, so its start is known when it is issued. The op then has two phases: its start
(reads: snapshot the inputs, run the tensor function), a simpy event, and its end (writes
land), an entry in the device's heap of landings that each start drains up to its own time
(:class:`overlap_harness.sim.op_values.OpValues`); the host drives ``env`` and the landings
forward to its own clock before it reads memory, so a host read sees exactly the writes that
landed by then. Writes landing at an instant take effect before reads starting at that
instant, so an op ordered after another on its stream sees its writes. Times are integer
nanoseconds.

Races. Every op is fed, in issue order, to :class:`model.detector.HBDetector`. Nothing the
clock says adds an edge: a freed block is reused by the happens-before rule of
:mod:`model.allocator`, and a ``query()`` used as a branch answers False unless the run forces
True (``query_outcomes``), so the race set is a property of the program whatever the timing
(STREAM-SEMANTICS.md, "Program edges and observations").

Serial mode (the oracle): every stream aliases one stream and the host synchronizes after
each op, so there are no races and values follow issue order.

Issue-order values (``values="issue_order"``): the streams, the timing and the detector are
those of an overlapped run, but every op's function runs when it is issued, so every read sees
the values of issue order, and the host's control flow (which requests finished, which slots
were handed out: decisions made on values it read) is the program's, whatever the timing. A
race can corrupt a value the host then branches on, which changes later accesses; so the race
*verdict* comes from a run of this kind (:func:`overlap_harness.runner.canonical_races`), and a
timed run shows what a race does to the values.
"""

from __future__ import annotations

import math
import random
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from heapq import heappop
from typing import Any

import numpy as np
import simpy
import torch

from overlap_harness.model.allocator import BlockPool, FreedBlock, pending_ops
from overlap_harness.model.detector import (
    HOST_AGENT,
    AccessRow,
    HBDetector,
    NodeRow,
    collector_paused,
)
from overlap_harness.model.device import (
    AccessSpec,
    Buffer,
    BufferId,
    Device,
    Event,
    EventId,
    OpFn,
    Sel,
    Stream,
    StreamId,
    SyncLabel,
    caller_source,
    norm_accesses,
    torch_sel,
)
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.trace import (
    HOST,
    OP_KIND_INDEX,
    OP_KINDS,
    DeviceRun,
    OpId,
    OpKind,
    OpRecord,
    QuerySite,
)
from overlap_harness.sim.block_tracking import BlockTracking, access_rows
from overlap_harness.sim.block_tracking import MemoryBlock as _Block
from overlap_harness.sim.op_values import (
    OpValues,
    RepeatCheck,
    SelectionCopy,
    numpy_view,
)

# op kinds as the detector's rows keep them (their index in OP_KINDS)
_KERNEL, _COPY, _RECORD, _WAIT, _HOST_SYNC, _HOST_READ, _HOST_WRITE, _FREE, _QUERY, _HOST_WORK = (
    OP_KIND_INDEX[kind] for kind in (OpKind.KERNEL, OpKind.COPY, OpKind.RECORD, OpKind.WAIT,
                                     OpKind.HOST_SYNC, OpKind.HOST_READ, OpKind.HOST_WRITE,
                                     OpKind.FREE, OpKind.QUERY, OpKind.HOST_WORK))

_NEVER = float("inf")  # a time after every op's end
GARBAGE = -7777  # what never-written memory holds (torch.empty); fixed so runs compare


def us_to_ns(us: float) -> int:
    """Microseconds (the scenario unit) to integer nanoseconds."""
    return round(us * 1000)


@dataclass(slots=True)
class _StreamState:
    agent: int
    name: str
    free_at: int = 0  # when the last enqueued op (or wait) is done


class SimDevice(BlockTracking, Device):
    """The simulated device. See the module docstring for the timing and value rules.

    Args:
        removed: sync labels to skip (a mutation).
        host_launch_us: host cost of issuing one op.
        jitter: every duration is scaled by a seeded factor in [1 - jitter, 1 + jitter].
        seed: seeds the jitter.
        serial: the oracle mode (one stream, host sync after every op).
        delays: extra microseconds before an op starts, by (op name, iteration): the
            injected delays of exploration and of the GPU replay.
        query_outcomes: the answer of a branching ``query()``, by (event name, iteration,
            occurrence in that iteration); unlisted queries answer False (the outcome that
            orders nothing). A forced True the clock has not reached makes the host wait.
        values: ``"timed"`` (reads at an op's simulated start, writes at its end) or
            ``"issue_order"`` (each op's function runs as it is issued; see the module
            docstring).
        history: False for long runs: the detector drops what can no longer race
            (:class:`model.detector.HBDetector`), so memory stays bounded; the races are the
            same, but the run has no timeline and no graph.
        shadow: False only with ``serial``: the detector skips its element-level state and
            checks (:class:`model.detector.HBDetector`), which can never fire when a host
            sync joins every op; the values, faults and timeline are the same, and the run
            reports no races. The oracle's call (:func:`overlap_harness.runner.run_spec`)
            uses it: the serial run is held against only for its values.
    """

    def __init__(
        self,
        removed: Iterable[SyncLabel | str] = (),
        *,
        host_launch_us: float = 5.0,
        jitter: float = 0.0,
        seed: int = 0,
        serial: bool = False,
        delays: Mapping[tuple[str, int], float] | None = None,
        query_outcomes: Mapping[tuple[str, int, int], bool] | None = None,
        values: str = "timed",
        history: bool = True,
        shadow: bool = True,
    ) -> None:
        super().__init__(removed, query_outcomes)
        if values not in ("timed", "issue_order"):
            raise DeviceUsageError(f"values: expected timed|issue_order, got {values!r}")
        if not shadow and not serial:
            raise DeviceUsageError("shadow=False needs serial=True: an overlapped run's "
                                   "accesses must be checked")
        self._issue_order = values == "issue_order"
        self.env = simpy.Environment()
        self.det = HBDetector(history=history, shadow=shadow)
        self.host_ns = 0
        self.serial = serial
        self._launch_ns = us_to_ns(host_launch_us)
        self._jitter = jitter
        self._rng = random.Random(seed)
        self._delays = {k: us_to_ns(v) for k, v in (delays or {}).items()}
        self._streams: dict[str, Stream] = {}
        self._sstate: dict[StreamId, _StreamState] = {}
        # by event id: when its latest record completes (None: never recorded); plain ints,
        # since wait_stream makes an event per call
        self._event_done: list[int | None] = []
        self._buffers: list[Buffer] = []
        self._views: list[torch.Tensor] = []  # by buffer id: its block's memory in its shape
        # the same memory as a numpy array (None for a dtype numpy lacks, bfloat16): writes land
        # through it, a quarter of the cost of torch indexing (op_values.OpValues.land)
        self._np_views: list[np.ndarray | None] = []
        self._blocks: list[_Block] = []
        self._ids_by_shape: dict[tuple[int, ...], np.ndarray] = {}
        self._pool = BlockPool()
        # the writes of ops that started, by (end, op): a heap the value events drain
        # (op_values.OpValues)
        self._landings: list[tuple[int, int, OpValues]] = []
        self._repeats = RepeatCheck()  # reserved for every block (buffer)
        self.query_sites: list[QuerySite] = []
        # each node's host issue time, by op; with the detector's node rows (plain tuples the
        # cyclic GC does not track, model.detector.NodeTable says why) :attr:`timeline` builds
        # the records when read
        self._issue = array("q")
        self._timeline: list[OpRecord] = []
        self._uninit: dict[tuple[str, str], str] = {}
        self._retired_landed: dict[int, np.ndarray] = {}  # BlockTracking._hand_over
        self._retired_until: deque[tuple[int, int]] = deque()
        self._dups: dict[tuple[str, str], str] = {}
        # by (other, waiter) stream ids: wait_stream's record and wait node names
        self._wait_stream_names: dict[tuple[StreamId, StreamId], tuple[str, str]] = {}
        self._node_names: dict[str, tuple[str, str]] = {}  # by event name: (record, wait)
        self._serial_state = None
        if serial:
            self._serial_state = _StreamState(self.det.add_agent("serial"), "serial")

    # -- helpers --------------------------------------------------------------------------
    def _dur(self, cost_us: float) -> int:
        ns = us_to_ns(cost_us)
        if self._jitter and ns:
            ns = max(0, round(ns * (1 + self._rng.uniform(-self._jitter, self._jitter))))
        return ns

    def _state(self, stream: Stream) -> _StreamState:
        return self._sstate[stream.id]

    def _next_op(self) -> OpId:
        return OpId(len(self._issue))

    @property
    def op_count(self) -> int:
        """Ops (nodes) issued so far."""
        return len(self._issue)

    def _node(self, name: str, agent: int, agent_name: str, kind: int, start: int, end: int,
              label: SyncLabel | None, source: str, issue: int,
              accesses: tuple[AccessRow, ...] = (), joins: Sequence[OpId] = (),
              observed: Sequence[OpId] = ()) -> NodeRow:
        """Feed one node to the detector as a plain row (``kind``: its index in ``OP_KINDS``)
        and log its issue time; the timeline record is built from the two when read. Returns
        the row (without history the detector may drop its own copy at once)."""
        row = self._row(name, agent, agent_name, kind, start, end, label, source)
        self.det.feed(row, accesses, joins, observed)
        self._issue.append(issue)
        return row

    def _row(self, name: str, agent: int, agent_name: str, kind: int, start: int, end: int,
             label: SyncLabel | None, source: str) -> NodeRow:
        """The next node as the detector's plain :data:`NodeRow`."""
        # ``source`` comes from caller_source, one interned string per protocol line
        return (OpId(len(self._issue)), name, agent, agent_name, kind, self.iteration,
                source, None if label is None else str(label), start, end)

    @property
    def timeline(self) -> list[OpRecord]:
        """Every op issued so far, in issue order (records built when read); empty without
        history."""
        built = self._timeline
        issue = self._issue
        if len(built) < len(issue) and self.det.history:
            with collector_paused():
                built.extend([OpRecord(op, name, agent_name, OP_KINDS[kind], issue[op],
                                       start or 0, end or 0, label, iteration, source)
                              for op, name, _agent, agent_name, kind, iteration, source, label,
                              start, end in self.det.nodes.rows_since(len(built))])
        return built

    def _advance_values(self) -> None:
        """Run simpy up to the host's clock: every write that landed by now is in memory."""
        peek, step, now = self.env.peek, self.env.step, self.host_ns
        while peek() <= now:
            step()
        if self._landings and self._landings[0][0] <= now:
            self._land_until(now)
        if self._retired_until:
            self._forget_retired(now)

    def _land_until(self, t_ns: int) -> None:
        """Land, in (end, op) order, every queued write whose op ends at or before ``t_ns``
        (:class:`overlap_harness.sim.op_values.OpValues` says why ends wait in this queue)."""
        landings = self._landings
        while landings and landings[0][0] <= t_ns:
            heappop(landings)[2].land()

    def _run_all(self) -> None:
        """Let every issued op start and land: simpy's events, then the landings left."""
        self.env.run()
        self._land_until(_NEVER)

    def _all_done_ns(self) -> int:
        """When every op issued so far has ended (and the host is where it is)."""
        return max([self.host_ns, *(s.free_at for s in self._sstate.values())])

    # -- resources ------------------------------------------------------------------------
    def stream(self, name: str) -> Stream:
        if name in self._streams:
            return self._streams[name]
        s = Stream(StreamId(len(self._streams)), name)
        self._streams[name] = s
        if self._serial_state is not None:
            self._sstate[s.id] = self._serial_state
        else:
            self._sstate[s.id] = _StreamState(self.det.add_agent(name), name)
        return s

    def event(self, name: str) -> Event:
        e = Event(EventId(len(self._event_done)), name)
        self._event_done.append(None)
        return e

    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, pinned: bool = False,
               fill: float | int | None = None, stream: Stream | None = None) -> Buffer:
        shape = tuple([int(d) for d in shape])
        numel = math.prod(shape)
        agent = -1 if stream is None or pinned else self._state(stream).agent
        key = (numel, dtype, pinned, agent)
        freed = self._pool.take(key, self.det.host_knows)
        block = None if freed is None else freed.payload
        if block is None:
            data = torch.full((numel,), GARBAGE, dtype=dtype)
            block = _Block(len(self._blocks), data, key)
            self._blocks.append(block)
            self.det.add_storage(block.id, numel, shape)
            self._repeats.reserve(numel)
        buf = Buffer(BufferId(len(self._buffers)), name, shape, dtype, pinned, block.id,
                     ids=self._element_ids(shape))
        # masks of its own (nothing written or landed); a reused block's old owner's ops may
        # still start or land, so its mask is kept until every op issued so far has ended
        self._hand_over(block, buf.id, self._all_done_ns())
        self._buffers.append(buf)
        # the block's memory in this shape, as torch and numpy see it; made once per shape
        views = block.views.get(shape)
        if views is None:
            view = block.data if len(shape) == 1 else block.data.view(shape)
            views = block.views[shape] = (view, numpy_view(view))
        self._views.append(views[0])
        self._np_views.append(views[1])
        if fill is not None:
            if stream is None:
                self.host_write(buf, None, fill, name=f"init:{name}")
            else:
                self.launch(stream, f"fill:{name}", lambda: fill, writes=[buf])
        return buf

    def _element_ids(self, shape: tuple[int, ...]) -> np.ndarray:
        """Flat element ids in ``shape`` (:attr:`Buffer.ids`), one read-only array per shape:
        every buffer of a shape has the same ids, and a run allocates tens of thousands."""
        ids = self._ids_by_shape.get(shape)
        if ids is None:
            ids = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
            ids.flags.writeable = False
            self._ids_by_shape[shape] = ids
        return ids

    def free(self, buf: Buffer) -> None:
        if buf.freed:
            raise DeviceUsageError(f"double free of {buf.name!r}")
        buf.freed = True
        block = self._blocks[buf.storage]
        pending = pending_ops(block.recorded, block.key[3], self.det.last_op)
        block.recorded = set()
        self._pool.give(FreedBlock(block.key, block, block.id, pending))
        self._node(f"free:{buf.name}", HOST_AGENT, HOST, _FREE, self.host_ns, self.host_ns,
                   None, caller_source(), self.host_ns)

    def _do_record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None) -> None:
        self._blocks[buf.storage].recorded.add(self._state(stream).agent)

    # -- work -----------------------------------------------------------------------------
    def launch(self, stream: Stream, name: str, fn: OpFn, reads: Sequence[AccessSpec] = (),
               writes: Sequence[AccessSpec] = (), cost_us: float = 0.0,
               observe: str | None = None) -> None:
        self._enqueue(stream, name, _KERNEL, fn, reads, writes, cost_us, observe,
                      caller_source())

    def copy(self, stream: Stream, src: AccessSpec, dst: AccessSpec, *, non_blocking: bool,
             cost_us: float = 0.0, label: SyncLabel | None = None, name: str = "copy") -> None:
        (s_buf, s_sel), = norm_accesses([src])
        d_pair = norm_accesses([dst])
        fn = (lambda v: v) if s_sel is None else SelectionCopy(s_sel)
        op = self._enqueue(stream, name, _COPY, fn, [(s_buf, s_sel)], d_pair, cost_us,
                           None, caller_source())
        if not non_blocking and self.sync_enabled(label):
            self._host_wait(f"{name}.sync", [op], self._sstate[stream.id].free_at, label)

    def _enqueue(self, stream: Stream, name: str, kind: int, fn: OpFn,
                 reads: Sequence[AccessSpec], writes: Sequence[AccessSpec],
                 cost_us: float, observe: str | None, source: str) -> OpId:
        """Issue one kernel or copy (``reads`` and ``writes`` as the protocol gave them): its
        timing, its node, and its value event. This is the path every kernel takes, so the
        node is fed as :meth:`_node` would feed it, written out."""
        read_pairs, rq = access_rows(reads, False)
        write_pairs, wq = access_rows(writes, True)
        st = self._sstate[stream.id]
        issue = self.host_ns = self.host_ns + self._launch_ns
        start = issue if issue >= st.free_at else st.free_at
        if self._delays:
            start += self._delays.get((name, self.iteration), 0)
        end = st.free_at = start + (self._dur(cost_us) if self._jitter else round(cost_us * 1000))
        repeated = self._track_init(name, rq, wq, write_pairs)
        op = len(self._issue)
        row = (op, name, st.agent, st.name, kind, self.iteration, source, None, start, end)
        self.det.feed(row, rq + wq)
        self._issue.append(issue)
        values = OpValues(self, row, fn, write_pairs,
                          None if observe is None else (observe, read_pairs), rq, wq, repeated)
        if self._issue_order:  # the function runs and its writes land now: issue order
            values.run()
            if write_pairs:
                values.land()
        else:
            values.schedule(start, end)
        if self.serial:
            self._host_wait(f"{name}.serial_sync", [op], end, None)
        return op

    def host_work(self, name: str, cost_us: float) -> None:
        start = self.host_ns
        self.host_ns += self._dur(cost_us)
        self._node(name, HOST_AGENT, HOST, _HOST_WORK, start, self.host_ns, None, caller_source(),
                   start)

    def host_read(self, buf: Buffer, sel: Sel = None, name: str = "host_read") -> torch.Tensor:
        self._check_host_access(buf, name)
        self._advance_values()
        _pairs, rq = access_rows([(buf, sel)], False)
        self._track_init(name, rq, [], [])
        self._check_landed(name, self.iteration, rq)
        self._node(name, HOST_AGENT, HOST, _HOST_READ, self.host_ns, self.host_ns, None,
                   caller_source(), self.host_ns, rq)
        view = self._views[buf.id]
        return (view if sel is None else view[torch_sel(sel, "cpu")]).clone()

    def host_write(self, buf: Buffer, sel: Sel, value: Any, name: str = "host_write") -> None:
        if buf.pinned or not name.startswith("init:"):
            self._check_host_access(buf, name)
        self._advance_values()
        _pairs, wq = access_rows([(buf, sel)], True)
        self._track_init(name, [], wq, [(buf, sel)])
        self._land(wq)
        self._node(name, HOST_AGENT, HOST, _HOST_WRITE, self.host_ns, self.host_ns, None,
                   caller_source(), self.host_ns, wq)
        view = self._views[buf.id]
        v = torch.as_tensor(value, dtype=buf.dtype)
        if sel is None:
            view.copy_(v.expand(buf.shape))
        else:
            view[torch_sel(sel, "cpu")] = v

    def _check_host_access(self, buf: Buffer, name: str) -> None:
        if buf.freed:
            raise DeviceUsageError(f"{name}: host access to freed buffer {buf.name!r}")
        if not buf.pinned:
            raise DeviceUsageError(
                f"{name}: the host cannot touch device buffer {buf.name!r}; copy it to a "
                "pinned buffer first")

    # -- sync -----------------------------------------------------------------------------
    def _do_record(self, event: Event, stream: Stream, label: SyncLabel | None) -> None:
        self._record(event.id, self._event_nodes(event.name)[0], stream, label, caller_source())

    def _event_nodes(self, name: str) -> tuple[str, str]:
        """The names of an event's record and wait nodes, made once per event name."""
        names = self._node_names.get(name)
        if names is None:
            names = self._node_names[name] = (f"record:{name}", f"wait:{name}")
        return names

    def _record(self, event_id: EventId, node_name: str, stream: Stream,
                label: SyncLabel | None, source: str) -> None:
        st = self._sstate[stream.id]
        host_ns = self.host_ns = self.host_ns + self._launch_ns
        at = host_ns if host_ns >= st.free_at else st.free_at
        # the node row, as _row makes it, written out (every fence takes this path)
        self.det.feed_record(event_id, (len(self._issue), node_name, st.agent, st.name, _RECORD,
                                        self.iteration, source,
                                        None if label is None else str(label), at, at))
        self._issue.append(host_ns)
        self._event_done[event_id] = at

    def _do_wait_event(self, stream: Stream, event: Event, label: SyncLabel | None) -> None:
        self._wait(stream, event.id, self._event_nodes(event.name)[1], label, caller_source())

    def _wait(self, stream: Stream, event_id: EventId, node_name: str, label: SyncLabel | None,
              source: str) -> None:
        st = self._sstate[stream.id]
        host_ns = self.host_ns = self.host_ns + self._launch_ns
        done = self._event_done[event_id]
        if done is not None and done > st.free_at:
            st.free_at = done
        at = host_ns if host_ns >= st.free_at else st.free_at
        self.det.feed_wait(event_id, (len(self._issue), node_name, st.agent, st.name, _WAIT,
                                      self.iteration, source,
                                      None if label is None else str(label), at, at))
        self._issue.append(host_ns)

    def _do_wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None) -> None:
        """A record of a fresh event on ``other`` and a wait for it on ``waiter``; the event
        gets the next id as :meth:`event` would give it, but no :class:`Event` record (nothing
        outside holds it), and the node names of each stream pair are made once."""
        names = self._wait_stream_names.get((other.id, waiter.id))
        if names is None:
            tmp = f"{other.name}->{waiter.name}"
            names = self._wait_stream_names[(other.id, waiter.id)] = (f"record:{tmp}",
                                                                      f"wait:{tmp}")
        event_id = len(self._event_done)
        self._event_done.append(None)
        source = caller_source()
        self._record(event_id, names[0], other, label, source)
        self._wait(waiter, event_id, names[1], label, source)
        if not self.det.history:  # nothing waits on it again
            self.det.forget_event(event_id)

    def _do_synchronize(self, target: Stream | Event | None, label: SyncLabel | None) -> None:
        if isinstance(target, Event):
            op = self.det.event_op(target.id)
            done = self._event_done[target.id]
            if op is None or done is None:  # never recorded: returns at once
                return
            self._host_wait(f"sync:{target.name}", [op], done, label)
            return
        states = list(self._sstate.values()) if target is None else [self._state(target)]
        ops = [o for s in states if (o := self.det.last_op(s.agent)) is not None]
        done = max((s.free_at for s in states), default=0)
        name = "sync:device" if target is None else f"sync:{target.name}"
        self._host_wait(name, ops, done, label)

    def _host_wait(self, name: str, ops: list[OpId], done: int, label: SyncLabel | None) -> None:
        start = self.host_ns
        self.host_ns = max(self.host_ns, done)
        self._node(name, HOST_AGENT, HOST, _HOST_SYNC, start, self.host_ns, label,
                   caller_source(), start, joins=ops)

    def _do_query(self, event: Event, label: SyncLabel | None, site: tuple[str, int, int],
                  forced: bool | None) -> bool:
        self.host_ns += self._launch_ns
        done = self._event_done[event.id]
        record = self.det.event_op(event.id)
        outcome = bool(forced) or done is None  # never recorded: True
        start = self.host_ns
        observed: list[OpId] = []
        if outcome and record is not None and done is not None:
            self.host_ns = max(self.host_ns, done)  # the timing in which it was True
            observed.append(record)
        row = self._node(f"query:{event.name}", HOST_AGENT, HOST, _QUERY, start, self.host_ns,
                         label, caller_source(), start, observed=observed)
        self.query_sites.append(QuerySite(*site, outcome, forced is not None, row[6]))
        return outcome

    def _do_poll(self, event: Event, label: SyncLabel | None) -> None:
        done = self._event_done[event.id]
        record = self.det.event_op(event.id)
        if record is None or done is None:  # never recorded: the first query says True
            return
        start = self.host_ns
        self.host_ns = max(self.host_ns, done)
        self._node(f"poll:{event.name}", HOST_AGENT, HOST, _HOST_SYNC, start, self.host_ns,
                   label, caller_source(), start, observed=[record])

    # -- results --------------------------------------------------------------------------
    def finish(self) -> DeviceRun:
        """Let all issued work land (no HB edge: nothing in the program waits), check every
        access, and return the run: its timeline, races and skipped syncs (the records of
        the first two are built when first read; the run keeps this device until then)."""
        self._run_all()
        end = self._all_done_ns()
        # every access is checked now; the records of the ops and pairs so far are built
        # when the run's timeline or races are first read (DeviceRun), not here
        n_ops = len(self._issue)
        n_races = self.det.race_count
        return DeviceRun(lambda: self.timeline[:n_ops], lambda: self.det.races[:n_races],
                         list(self.skipped_syncs), end, list(self._uninit.values()),
                         list(self._dups.values()), list(self.query_sites))

    def drain(self) -> None:
        """Let all issued work land, as :meth:`finish` does, without building the run's
        records: for a run read only for its values and observations (the serial oracle)."""
        self._run_all()

    def value(self, buf: Buffer, sel: Sel = None) -> torch.Tensor:
        """Out-of-band look at memory now (tests, oracle): no access is recorded."""
        view = self._views[buf.id]
        return (view if sel is None else view[torch_sel(sel, "cpu")]).clone()
