"""The trace a real device records while it runs, and its replay into the race detector.

On a GPU the times of an op are only known once it has run, but the happens-before detector
(:class:`model.detector.HBDetector`) wants each node's times when it is fed (to call a race
latent or manifest). So :class:`TraceRecorder` keeps every node in host issue order, with its
accesses, joins and event binding, and *stamps* instead of times: an ``int`` is a host clock
reading in nanoseconds, anything else is a device timing handle (a CUDA event) that a
``clock`` callable turns into nanoseconds on the host's time base. :meth:`TraceRecorder.finish`
resolves every stamp, aligns the two clocks (:func:`fit_shift`), feeds the detector in issue
order and returns the same :class:`model.trace.DeviceRun` a simulated run returns.

Plain Python: the tests drive it with a fake clock, no GPU needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.model.detector import HOST_AGENT, AccessReq, HBDetector, NodeInfo
from overlap_harness.model.trace import HOST, DeviceRun, OpId, OpKind, OpRecord

Stamp = Any  # int: host ns; otherwise a device timing handle the clock resolves
Clock = Callable[[Any], int]


def ms_to_ns(ms: float) -> int:
    """CUDA event milliseconds (``Event.elapsed_time``) to integer nanoseconds."""
    return round(ms * 1_000_000)


def is_host_stamp(stamp: Stamp) -> bool:
    """Host stamps are plain ints (ns on the host clock); device handles are anything else."""
    return isinstance(stamp, int) and not isinstance(stamp, bool)


def fit_shift(lo: int | None, hi: int | None) -> int:
    """The shift to add to device times so the two clocks agree with causality.

    ``lo`` is the least shift that puts every device op's start at or after its issue on the
    host; ``hi`` the greatest that puts every synced op's end at or before the host sync that
    waited for it. The host/device offset measured at start-up is only good to a few
    microseconds, so: no shift when 0 already fits, else the nearest end of ``[lo, hi]``, else
    (contradictory bounds, a clock drift) their midpoint.
    """
    if lo is not None and hi is not None and lo > hi:
        return (lo + hi) // 2
    if lo is not None and lo > 0:
        return lo
    if hi is not None and hi < 0:
        return hi
    return 0


@dataclass(slots=True)
class Pending:
    """One recorded node, times still as stamps. ``work`` is when the op's real work began
    (after its cost sleep): reads take effect then, writes at ``end``."""

    op: OpId
    name: str
    agent: int
    agent_name: str
    kind: OpKind
    iteration: int
    source: str
    label: str | None
    issue: int
    start: Stamp
    end: Stamp
    work: Stamp | None = None
    accesses: list[AccessReq] = field(default_factory=list)
    joins: list[OpId] = field(default_factory=list)
    event: object | None = None  # the event key, for records and waits
    observed: list[OpId] = field(default_factory=list)  # seen complete (a query, a poll)


class TraceRecorder:
    """Issue-ordered node log of one device run; see the module docstring."""

    def __init__(self) -> None:
        self.det = HBDetector()
        # the same nodes without accesses or times, fed live: the allocator's reuse rule asks
        # what happens before the host now (``host_knows``), long before ``finish``
        self._clocks = HBDetector()
        self.entries: list[Pending] = []
        self._last: dict[int, OpId] = {}
        self._bound: dict[object, OpId] = {}

    # -- registration ---------------------------------------------------------------------
    def add_agent(self, name: str) -> int:
        """Register a stream; returns its agent index (host is 0)."""
        self._clocks.add_agent(name)
        return self.det.add_agent(name)

    def add_storage(self, storage: int, numel: int, shape: tuple[int, ...]) -> None:
        """Register a memory block (once: a reused block keeps its access history)."""
        self.det.add_storage(storage, numel, shape)

    def agent_name(self, agent: int) -> str:
        """The name of agent ``agent``."""
        return self.det.agent_names[agent]

    # -- the log --------------------------------------------------------------------------
    def add(
        self,
        name: str,
        agent: int,
        kind: OpKind,
        *,
        iteration: int,
        source: str,
        issue: int,
        start: Stamp,
        end: Stamp,
        work: Stamp | None = None,
        label: str | None = None,
        accesses: Sequence[AccessReq] = (),
        joins: Sequence[OpId] = (),
        event: object | None = None,
        observed: Sequence[OpId] = (),
    ) -> OpId:
        """Log a node; returns its op id. A RECORD binds ``event`` to this node; ``observed``
        are nodes the host saw complete (a query that said True, a poll loop)."""
        op = OpId(len(self.entries))
        entry = Pending(op, name, agent, self.agent_name(agent), kind, iteration, source,
                        label, issue, start, end, work, list(accesses), list(joins), event,
                        list(observed))
        self.entries.append(entry)
        self._feed(self._clocks, entry, NodeInfo(op, name, agent, entry.agent_name, kind,
                                                 iteration, source, label, None, None), ())
        self._last[agent] = op
        if kind == OpKind.RECORD:
            self._bound[event] = op
        return op

    def host_knows(self, op: OpId) -> bool:
        """Does ``op`` happen before everything the host issues from now on (by the program's
        edges)? The allocator's reuse test (:mod:`model.allocator`)."""
        return self._clocks.host_knows(op)

    @staticmethod
    def _feed(det: HBDetector, e: Pending, info: NodeInfo, accesses: Sequence[AccessReq]) -> None:
        if e.kind == OpKind.RECORD:
            det.on_record(e.event, info)
        elif e.kind == OpKind.WAIT:
            det.on_wait(e.event, info)
        else:
            det.on_op(info, accesses, e.joins, e.observed)

    def last_op(self, agent: int) -> OpId | None:
        """The latest node logged on ``agent`` (what a stream sync waits for)."""
        return self._last.get(agent)

    def event_op(self, key: object) -> OpId | None:
        """The record an event captures now, or None if it was never recorded."""
        return self._bound.get(key)

    def stream_agents(self) -> list[int]:
        """Every stream agent registered so far."""
        return list(range(1, len(self.det.agent_names)))

    # -- replay ---------------------------------------------------------------------------
    def finish(self, clock: Clock) -> DeviceRun:
        """Resolve stamps with ``clock``, align the clocks, feed the detector in issue order.

        Returns the timeline (one :class:`OpRecord` per node) and the races; the caller adds
        the skipped syncs.
        """
        dev = {id(s): clock(s) for e in self.entries for s in (e.start, e.work, e.end)
               if s is not None and not is_host_stamp(s)}
        shift = fit_shift(*self._bounds(dev))

        def t(s: Stamp) -> int:
            return s if is_host_stamp(s) else dev[id(s)] + shift

        timeline: list[OpRecord] = []
        for e in self.entries:
            start, end = t(e.start), t(e.end)
            read_at = start if e.work is None else t(e.work)
            info = NodeInfo(e.op, e.name, e.agent, e.agent_name, e.kind, e.iteration, e.source,
                            e.label, read_at, end)
            self._feed(self.det, e, info, e.accesses)
            timeline.append(OpRecord(e.op, e.name, e.agent_name, e.kind, e.issue, start, end,
                                     e.label, e.iteration, e.source))
        end_ns = max((r.end_ns for r in timeline), default=0)
        return DeviceRun(timeline, list(self.det.races), [], end_ns)

    def _bounds(self, dev: dict[int, int]) -> tuple[int | None, int | None]:
        lo: int | None = None
        hi: int | None = None
        for e in self.entries:
            if not is_host_stamp(e.start):
                gap = e.issue - dev[id(e.start)]
                lo = gap if lo is None else max(lo, gap)
            if e.agent == HOST_AGENT and e.kind == OpKind.HOST_SYNC and is_host_stamp(e.end):
                for j in e.joins:
                    s = self.entries[j].end
                    if not is_host_stamp(s):
                        room = e.end - dev[id(s)]
                        hi = room if hi is None else min(hi, room)
        return lo, hi


__all__ = ["HOST", "Clock", "Pending", "Stamp", "TraceRecorder", "fit_shift", "ms_to_ns"]
