"""CudaDevice: the device API on real CUDA streams, with forced delays and a measured timeline.

A thin adapter from :class:`model.device.Device` to torch.cuda, so the protocol that runs on
``SimDevice`` runs unchanged on a GPU:

- streams are ``torch.cuda.Stream``s, events ``torch.cuda.Event``s (a never-recorded event
  is tracked here, so waiting on it is a no-op, as in SimDevice); a branching ``query``
  takes the simulator's outcome (``query_outcomes``, default False; a True is made true by
  polling the event first), so both devices follow the same branch;
- buffers are CUDA tensors, or pinned CPU tensors (``pinned=True``). By default a freed
  block goes back to :class:`model.allocator.BlockPool`, the caching allocator's reuse rule
  decided by happens-before, as in the simulator, so a reuse race hands the block to the owner
  the simulator predicts; with ``torch_allocator=True`` memory comes from, and goes back to,
  torch's caching allocator (``free`` drops the last reference), as a sanitizer run needs: a
  block torch hands back after ``record_stream`` gets a new storage id there (torch's event
  ordered its old accesses before the new ones, so no race between them can exist);
- host values an op writes, and index lists, reach the GPU through
  :class:`gpu_check.staging.Stager` (no hidden host sync, no copy queued behind a delay);
- an op's ``cost_us`` is reproduced by ``torch.cuda._sleep`` before its work, at the rate
  :mod:`gpu_check.calibration` measured, and ``delays`` add an extra sleep before an op (the
  injected delays that force the interleaving the simulator predicts), and ``gates`` hold
  an op's work until the op the simulator ran first on a racing pair has ended
  (:mod:`gpu_check.flags`; out of band, so the trace keeps the race);
- ``launch`` runs ``fn(*live read tensors)`` inside ``torch.cuda.stream(s)`` and assigns each
  returned value to ``buf[sel]`` there; ``observe`` clones the read values on the stream.

Timing: CUDA events (``enable_timing``) mark each op's start (after any injected delay), the
start of its work (after its cost sleep: reads take effect then) and its end (writes); the host
side is read with ``time.perf_counter_ns``. Both are put on one base, aligned at start-up by a
reference event. Every node goes to a :class:`gpu_check.trace_log.TraceRecorder` in issue order;
``finish`` resolves the times and replays the trace into the same happens-before detector the
simulator uses, so a GPU run's races come from the same code.

Differences from SimDevice: a kernel reads its live inputs after its cost sleep (the simulator
snapshots them at its start), so the forced-delay traces keep racing accesses far apart; a
freed block goes to the next allocation the simulator would give it (with torch's allocator,
a block is recognised as reused only when a new buffer of the same size and dtype lands at
the same address; a smaller buffer carved from it is not seen as reuse). CUDA loads a
kernel's module lazily at its first launch, which can wait for the GPU to go idle: run a
program once unmeasured (:func:`gpu_check.traces.warm_up`) before the run that counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch

from overlap_harness.gpu_check.calibration import Calibration, calibrate, cycles_for
from overlap_harness.gpu_check.flags import GateSet, GateStats
from overlap_harness.gpu_check.staging import Stager, intended_sync, prewarm
from overlap_harness.gpu_check.trace_log import TraceRecorder, ms_to_ns
from overlap_harness.model.allocator import BlockPool, FreedBlock, pending_ops
from overlap_harness.model.detector import HOST_AGENT, AccessReq
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
from overlap_harness.model.opkeys import Gate, KeyCounter, OpKey
from overlap_harness.model.staging import staging
from overlap_harness.model.trace import HOST, DeviceRun, OpId, OpKind


def is_view_sel(sel: Sel) -> bool:
    """True when ``t[sel]`` is a view (None, int, slice, or a tuple of those): the only
    selections a pinned buffer accepts, since a gather on the host would run at issue time."""
    if sel is None or isinstance(sel, int | slice):
        return True
    return isinstance(sel, tuple) and all(isinstance(s, int | slice) for s in sel)


class CudaDevice(Device):
    """The CUDA device. See the module docstring for what it does and how it differs.

    Args:
        removed: sync labels to skip (a mutation).
        delays: extra microseconds before an op starts, by (op name, iteration).
        calibration: a measured ``_sleep`` rate; measured now when None.
        empty_cache: release the allocator's cached blocks first, so reuse in this run
            follows this run's frees only.
        gates: pairs of ops whose order this run must keep (:mod:`gpu_check.flags`); the
            trace does not see them.
        torch_allocator: take memory from torch's caching allocator and give it back at
            ``free``, instead of the harness's :class:`BlockPool` (a sanitizer run, which
            follows torch's allocations, needs this).
    """

    torch_device = "cuda"

    def __init__(
        self,
        removed: Iterable[SyncLabel | str] = (),
        *,
        delays: Mapping[tuple[str, int], float] | None = None,
        calibration: Calibration | None = None,
        empty_cache: bool = True,
        gates: Sequence[Gate] = (),
        torch_allocator: bool = False,
        query_outcomes: Mapping[tuple[str, int, int], bool] | None = None,
    ) -> None:
        super().__init__(removed, query_outcomes)
        if not torch.cuda.is_available():
            raise DeviceUsageError("CudaDevice needs a CUDA device; none is available")
        if empty_cache:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        self.cal = calibration or calibrate()
        self._stager = Stager()
        self.rec = TraceRecorder()
        self._delays = dict(delays or {})
        self._streams: dict[str, Stream] = {}
        self._cs: dict[StreamId, torch.cuda.Stream] = {}
        self._agent: dict[StreamId, int] = {}
        self._stream_of: dict[int, StreamId] = {}  # agent -> stream
        self._events: dict[EventId, torch.cuda.Event] = {}
        self._recorded: set[EventId] = set()
        self._tensors: dict[BufferId, torch.Tensor] = {}
        self._buffers: list[Buffer] = []
        self._block_key: dict[BufferId, tuple] = {}
        self._pool: dict[tuple, int] = {}  # torch_allocator: freed key -> storage
        self._users: dict[BufferId, set[int]] = {}  # agents from record_stream
        self._n_storage = 0
        self._blocks = None if torch_allocator else BlockPool()
        self._flat: dict[BufferId, torch.Tensor] = {}  # BlockPool mode: each buffer's block
        self._fresh_cs = torch.cuda.Stream()  # fresh blocks are allocated (and filled) here
        prewarm(self._fresh_cs)
        self._keys = KeyCounter()
        self._gates = GateSet(gates) if gates else None
        self.gate_stats: GateStats | None = None
        torch.cuda.synchronize()
        self._ref = torch.cuda.Event(enable_timing=True)
        before = time.perf_counter_ns()
        self._ref.record()
        after = time.perf_counter_ns()
        self._ref.synchronize()
        self._t0 = (before + after) // 2  # host ns at which the reference event ran

    # -- clocks ---------------------------------------------------------------------------
    def now(self) -> int:
        """Host time in ns since the reference event."""
        return time.perf_counter_ns() - self._t0

    def _stamp(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # on the current stream
        return ev

    def _clock(self, ev: torch.cuda.Event) -> int:
        return ms_to_ns(self._ref.elapsed_time(ev))

    def _dsel(self, sel: Sel) -> Any:
        """``sel`` for indexing a CUDA tensor on the current stream, staged without a sync."""
        if isinstance(sel, tuple):
            return tuple(self._dsel(x) for x in sel)
        if isinstance(sel, list | np.ndarray):
            sel = torch.as_tensor(np.asarray(sel, dtype=np.int64))
        if isinstance(sel, torch.Tensor) and sel.device.type != "cuda":
            return self._stager.to_device(sel, torch.cuda.current_stream())
        return sel

    def _sleep_us(self, us: float) -> None:
        if us > 0:
            torch.cuda._sleep(cycles_for(us, self.cal.cycles_per_us))

    # -- resources ------------------------------------------------------------------------
    def stream(self, name: str) -> Stream:
        if name in self._streams:
            return self._streams[name]
        s = Stream(StreamId(len(self._streams)), name)
        self._streams[name] = s
        self._cs[s.id] = cs = torch.cuda.Stream()
        prewarm(cs)
        self._agent[s.id] = self.rec.add_agent(name)
        self._stream_of[self._agent[s.id]] = s.id
        return s

    def cuda_stream(self, stream: Stream) -> torch.cuda.Stream:
        """The torch stream behind ``stream``."""
        return self._cs[stream.id]

    def event(self, name: str) -> Event:
        e = Event(EventId(len(self._events)), name)
        self._events[e.id] = torch.cuda.Event()
        return e

    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, pinned: bool = False,
               fill: float | int | None = None, stream: Stream | None = None) -> Buffer:
        shape = tuple(int(d) for d in shape)
        numel = int(np.prod(shape)) if shape else 1
        n_before = self._n_storage
        if self._blocks is None:
            t, storage = self._torch_block(shape, dtype, pinned, stream, numel)
        else:
            t, storage = self._pool_block(dtype, pinned, stream, numel)
            t = t.view(shape)
        fresh = self._n_storage > n_before  # a new storage id: no buffer has held the block
        ids = np.arange(numel, dtype=np.int64).reshape(shape)
        buf = Buffer(BufferId(len(self._buffers)), name, shape, dtype, pinned, storage, ids=ids)
        self._buffers.append(buf)
        self._tensors[buf.id] = t
        if fill is not None:
            if stream is None:
                self.host_write(buf, None, fill, name=f"init:{name}")
            else:
                self.launch(stream, f"fill:{name}", lambda: fill, writes=[buf])
        elif fresh:
            self._fresh_block(t, pinned, stream)
        return buf

    def _fresh_block(self, t: torch.Tensor, pinned: bool, stream: Stream | None) -> None:
        """Called with a block no buffer of this run has held yet, when ``buffer`` is given
        no ``fill``: a hook (SentinelCudaDevice writes the simulator's initial contents)."""

    def _torch_block(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool,
                     stream: Stream | None, numel: int) -> tuple[torch.Tensor, int]:
        """A tensor from torch's caching allocator and its storage id: a freed block's when
        the allocator handed the same one back with no ``record_stream`` (a reuse the program
        allows at once), a new one otherwise (torch waited for the recorded streams' event, so
        the old accesses are ordered before the new: they cannot race)."""
        if pinned:
            t = torch.empty(shape, dtype=dtype, pin_memory=True)
        else:
            ctx = torch.cuda.stream(self._cs[stream.id]) if stream is not None else nullcontext()
            with ctx:
                t = torch.empty(shape, dtype=dtype, device="cuda")
        key = (t.data_ptr(), numel, dtype, pinned)
        self._block_key[BufferId(len(self._buffers))] = key
        prev = self._pool.pop(key, None)
        if prev is not None:
            return t, prev
        return t, self._new_storage(numel, shape)

    def _pool_block(self, dtype: torch.dtype, pinned: bool, stream: Stream | None,
                    numel: int) -> tuple[torch.Tensor, int]:
        """A flat block from :class:`BlockPool` (the simulator's choice, by happens-before),
        or a fresh one allocated on the pool's own stream; and its storage id."""
        assert self._blocks is not None
        agent = -1 if stream is None or pinned else self._agent[stream.id]
        key = (numel, dtype, pinned, agent)
        bid = BufferId(len(self._buffers))
        self._block_key[bid] = key
        block = self._blocks.take(key, self.rec.host_knows)
        if block is not None:
            self._flat[bid] = block.payload
            return block.payload, block.storage
        if pinned:
            t = torch.empty(numel, dtype=dtype, pin_memory=True)
        else:
            with torch.cuda.stream(self._fresh_cs):
                t = torch.empty(numel, dtype=dtype, device="cuda")
        self._flat[bid] = t
        return t, self._new_storage(numel, (numel,))

    def _new_storage(self, numel: int, shape: tuple[int, ...]) -> int:
        storage = self._n_storage
        self._n_storage += 1
        self.rec.add_storage(storage, numel, shape)
        return storage

    def free(self, buf: Buffer) -> None:
        if buf.freed:
            raise DeviceUsageError(f"double free of {buf.name!r}")
        buf.freed = True
        key = self._block_key.pop(buf.id)
        owner = key[3] if self._blocks is not None else None  # torch's keys hold no stream
        pending = pending_ops(self._users.pop(buf.id, set()), owner, self.rec.last_op)
        if self._blocks is None:
            if not pending:
                self._pool[key] = buf.storage
        else:
            self._blocks.give(FreedBlock(key, self._flat.pop(buf.id), buf.storage, pending))
        del self._tensors[buf.id]  # torch's allocator: the last reference, the block goes back
        now = self.now()
        self._host_node(f"free:{buf.name}", OpKind.FREE, now, now)

    def _do_record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None) -> None:
        if self._blocks is None:
            self._tensors[buf.id].record_stream(self._cs[stream.id])
        self._users.setdefault(buf.id, set()).add(self._agent[stream.id])

    def tensor(self, buf: Buffer) -> torch.Tensor:
        """The live tensor behind ``buf`` (out of band: no access is recorded)."""
        return self._tensors[buf.id]

    # -- work -----------------------------------------------------------------------------
    def launch(self, stream: Stream, name: str, fn: OpFn, reads: Sequence[AccessSpec] = (),
               writes: Sequence[AccessSpec] = (), cost_us: float = 0.0,
               observe: str | None = None) -> None:
        reads_, writes_ = norm_accesses(reads), norm_accesses(writes)
        for b, _s in reads_ + writes_:
            if b.pinned:
                raise DeviceUsageError(f"{name}: a kernel cannot touch pinned buffer "
                                       f"{b.name!r} on CudaDevice; copy it to the device first")
        issue = self.now()
        with torch.cuda.stream(self._cs[stream.id]):
            key, start, work = self._begin(stream, name, cost_us)
            vals = [self._tensors[b.id] for b, _s in reads_]
            if observe is not None:
                obs = self.observations.setdefault((observe, self.iteration), [])
                obs.extend((v if s is None else v[self._dsel(s)]).clone()
                           for v, (_b, s) in zip(vals, reads_, strict=True))
            cur = self._cs[stream.id]
            with staging(lambda t: self._stager.to_device(t, cur)):
                res = fn(*vals)
            if writes_:
                outs = res if isinstance(res, tuple) else (res,)
                for (b, s), v in zip(writes_, outs, strict=True):
                    self._assign(b, s, v)
            end = self._end(key)
        self.rec.add(name, self._agent[stream.id], OpKind.KERNEL, iteration=self.iteration,
                     source=caller_source(), issue=issue, start=start, work=work, end=end,
                     accesses=self._reqs(reads_, False) + self._reqs(writes_, True))

    def _begin(self, stream: Stream, name: str,
               cost_us: float) -> tuple[OpKey, torch.cuda.Event, torch.cuda.Event]:
        """On the current stream: the injected delay, the start mark, the cost, the gates
        this op waits on, the work mark; with the op's key for :meth:`_end`."""
        key = self._keys.key(stream.name, name, self.iteration)
        self._sleep_us(self._delays.get((name, self.iteration), 0.0))
        start = self._stamp()
        self._sleep_us(cost_us)
        if self._gates is not None:
            self._gates.stream_wait(key, torch.cuda.current_stream())
        return key, start, self._stamp()

    def _end(self, key: OpKey) -> torch.cuda.Event:
        """On the current stream: the end mark, then the gates this op sets."""
        end = self._stamp()
        if self._gates is not None:
            self._gates.stream_set(key, torch.cuda.current_stream())
        return end

    @contextmanager
    def _host_gates(self, name: str) -> Iterator[None]:
        """Around a host access: wait for the gates it waits on, then set its own."""
        key = self._keys.key(HOST, name, self.iteration)
        if self._gates is not None:
            self._gates.host_wait(key)
        yield
        if self._gates is not None:
            self._gates.host_set(key)

    def _assign(self, buf: Buffer, sel: Sel, value: Any) -> None:
        """``buf[sel] = value`` on the current stream; host values are staged through pinned
        memory so the copy is asynchronous like the rest of the op."""
        t = self._tensors[buf.id]
        v = torch.as_tensor(value, dtype=buf.dtype) if not isinstance(value, torch.Tensor) \
            else value.to(buf.dtype)
        if v.device.type != "cuda":
            v = self._stager.to_device(v, torch.cuda.current_stream())
        if sel is None:
            t.copy_(v.expand(buf.shape))
        else:
            t[self._dsel(sel)] = v

    def copy(self, stream: Stream, src: AccessSpec, dst: AccessSpec, *, non_blocking: bool,
             cost_us: float = 0.0, label: SyncLabel | None = None, name: str = "copy") -> None:
        ((sb, ss),) = norm_accesses([src])
        ((db, ds),) = norm_accesses([dst])
        for b, s in ((sb, ss), (db, ds)):
            if b.pinned and not is_view_sel(s):
                raise DeviceUsageError(f"{name}: pinned buffer {b.name!r} takes only int or "
                                       f"slice selections on CudaDevice, got {s!r}")
        issue = self.now()
        with torch.cuda.stream(self._cs[stream.id]):
            key, start, work = self._begin(stream, name, cost_us)
            st, dt = self._tensors[sb.id], self._tensors[db.id]
            v = st if ss is None else st[ss if sb.pinned else self._dsel(ss)]
            if db.pinned or ds is None or is_view_sel(ds):
                (dt if ds is None else dt[ds]).copy_(v, non_blocking=True)
            else:
                dt[self._dsel(ds)] = v.to("cuda", non_blocking=True)
            end = self._end(key)
        op = self.rec.add(name, self._agent[stream.id], OpKind.COPY, iteration=self.iteration,
                          source=caller_source(), issue=issue, start=start, work=work, end=end,
                          accesses=self._reqs([(sb, ss)], False) + self._reqs([(db, ds)], True))
        if not non_blocking and self.sync_enabled(label):
            self._host_wait(f"{name}.sync", [op], end.synchronize, label)

    def host_work(self, name: str, cost_us: float) -> None:
        start = self.now()
        until = time.perf_counter_ns() + round(cost_us * 1000)
        while time.perf_counter_ns() < until:  # busy, like a host thread doing real work
            pass
        self._host_node(name, OpKind.HOST_WORK, start, self.now())

    def host_read(self, buf: Buffer, sel: Sel = None, name: str = "host_read") -> torch.Tensor:
        self._check_host_access(buf, name)
        t = self._tensors[buf.id]
        with self._host_gates(name):
            now = self.now()
            value = (t if sel is None else t[torch_sel(sel, "cpu")]).clone()
            self._host_node(name, OpKind.HOST_READ, now, now, self._reqs([(buf, sel)], False))
        return value

    def host_write(self, buf: Buffer, sel: Sel, value: Any, name: str = "host_write") -> None:
        init = name.startswith("init:")
        if buf.pinned or not init:
            self._check_host_access(buf, name)
        t = self._tensors[buf.id]
        with self._host_gates(name):
            start = self.now()
            self._host_store(t, buf, sel, torch.as_tensor(value, dtype=buf.dtype))
            self._host_node(name, OpKind.HOST_WRITE, start, self.now(),
                            self._reqs([(buf, sel)], True))

    def _host_store(self, t: torch.Tensor, buf: Buffer, sel: Sel, v: torch.Tensor) -> None:
        """``t[sel] = v`` from the host: in place for pinned memory; device memory (host
        initialisation) through the stager on the current stream, then waited."""
        if buf.pinned:
            view = t if sel is None else t[torch_sel(sel, "cpu")]
            if sel is None or is_view_sel(sel):
                view.copy_(v.expand(view.shape))
            else:
                t[torch_sel(sel, "cpu")] = v
            return
        cur = torch.cuda.current_stream()
        d = self._stager.to_device(v, cur)
        if sel is None:
            t.copy_(d.expand(t.shape))
        else:
            t[self._dsel(sel)] = d
        with intended_sync():
            cur.synchronize()

    def _check_host_access(self, buf: Buffer, name: str) -> None:
        if buf.freed:
            raise DeviceUsageError(f"{name}: host access to freed buffer {buf.name!r}")
        if not buf.pinned:
            raise DeviceUsageError(
                f"{name}: the host cannot touch device buffer {buf.name!r}; copy it to a "
                "pinned buffer first")

    def _reqs(self, pairs: Sequence[tuple[Buffer, Sel]], write: bool) -> list[AccessReq]:
        return [AccessReq(b.storage, b.id, b.name, b.elements(s), write, b.pinned)
                for b, s in pairs]

    def _host_node(self, name: str, kind: OpKind, start: int, end: int,
                   accesses: list[AccessReq] | None = None, joins: Sequence[OpId] = (),
                   label: SyncLabel | None = None) -> OpId:
        return self.rec.add(name, HOST_AGENT, kind, iteration=self.iteration,
                            source=caller_source(), issue=start, start=start, end=end,
                            label=None if label is None else str(label),
                            accesses=accesses or [], joins=joins)

    # -- sync -----------------------------------------------------------------------------
    def _stream_mark(self, stream: Stream, name: str, kind: OpKind, label: SyncLabel | None,
                     issue: int, event: EventId) -> None:
        mark = self._stamp()  # on the stream: when it got past the record / wait
        self.rec.add(name, self._agent[stream.id], kind, iteration=self.iteration,
                     source=caller_source(), issue=issue, start=mark, end=mark,
                     label=None if label is None else str(label), event=event)

    def _do_record(self, event: Event, stream: Stream, label: SyncLabel | None) -> None:
        issue = self.now()
        with torch.cuda.stream(self._cs[stream.id]):
            self._events[event.id].record()
            self._recorded.add(event.id)
            self._stream_mark(stream, f"record:{event.name}", OpKind.RECORD, label, issue,
                              event.id)

    def _do_wait_event(self, stream: Stream, event: Event, label: SyncLabel | None) -> None:
        issue = self.now()
        with torch.cuda.stream(self._cs[stream.id]):
            if event.id in self._recorded:  # never recorded: a no-op, tracked here
                self._cs[stream.id].wait_event(self._events[event.id])
            self._stream_mark(stream, f"wait:{event.name}", OpKind.WAIT, label, issue, event.id)

    def _do_wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None) -> None:
        tmp = self.event(f"{other.name}->{waiter.name}")
        self._do_record(tmp, other, label)
        self._do_wait_event(waiter, tmp, label)

    def _do_synchronize(self, target: Stream | Event | None, label: SyncLabel | None) -> None:
        if isinstance(target, Event):
            op = self.rec.event_op(target.id)
            if op is None or target.id not in self._recorded:  # never recorded: returns
                return
            self._host_wait(f"sync:{target.name}", [op], self._events[target.id].synchronize,
                            label)
            return
        if target is None:
            agents, wait, name = self.rec.stream_agents(), torch.cuda.synchronize, "sync:device"
        else:
            agents = [self._agent[target.id]]
            wait, name = self._cs[target.id].synchronize, f"sync:{target.name}"
        ops = [o for a in agents if (o := self.rec.last_op(a)) is not None]
        self._host_wait(name, ops, wait, label)

    def _host_wait(self, name: str, ops: list[OpId], wait: Any, label: SyncLabel | None) -> None:
        start = self.now()
        with intended_sync():
            wait()
        self._host_node(name, OpKind.HOST_SYNC, start, self.now(), joins=ops, label=label)

    def _do_query(self, event: Event, label: SyncLabel | None, site: tuple[str, int, int],
                  forced: bool | None) -> bool:
        """The simulator's outcome (``query_outcomes``, default False), made true on the GPU:
        a True polls the event first. A never-recorded event answers True, as CUDA's does."""
        outcome = bool(forced)
        op = self.rec.event_op(event.id)
        start = self.now()
        if event.id not in self._recorded or op is None:
            outcome, observed = True, []
        elif outcome:
            with intended_sync():
                while not self._events[event.id].query():
                    pass
            observed = [op]
        else:
            observed = []
        self.rec.add(f"query:{event.name}", HOST_AGENT, OpKind.QUERY, iteration=self.iteration,
                     source=caller_source(), issue=start, start=start, end=self.now(),
                     label=None if label is None else str(label), observed=observed)
        return outcome

    def _do_poll(self, event: Event, label: SyncLabel | None) -> None:
        op = self.rec.event_op(event.id)
        if op is None or event.id not in self._recorded:  # the first query says True
            return
        start = self.now()
        with intended_sync():
            while not self._events[event.id].query():
                pass
        self.rec.add(f"poll:{event.name}", HOST_AGENT, OpKind.HOST_SYNC,
                     iteration=self.iteration, source=caller_source(), issue=start, start=start,
                     end=self.now(), label=None if label is None else str(label),
                     observed=[op])

    # -- results --------------------------------------------------------------------------
    def finish(self) -> DeviceRun:
        """Wait for all issued work (no HB edge: nothing in the program waits), fetch the
        observations to the CPU, and return the measured timeline with the detector's races.
        Gates no op set are released first (:attr:`gate_stats` says how many)."""
        if self._gates is not None:
            self.gate_stats = self._gates.close()
        torch.cuda.synchronize()
        for key, vals in self.observations.items():
            self.observations[key] = [v.cpu() for v in vals]
        run = self.rec.finish(self._clock)
        run.skipped_syncs = list(self.skipped_syncs)
        return run

    def value(self, buf: Buffer, sel: Sel = None) -> torch.Tensor:
        """Out-of-band look at memory after all work is done (tests): no access recorded."""
        torch.cuda.synchronize()
        t = self._tensors[buf.id]
        return (t if sel is None else t[torch_sel(sel, t.device)]).cpu().clone()
