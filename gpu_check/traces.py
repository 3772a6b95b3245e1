"""The semantics traces of tests/sim/test_semantics.py, written once against the device API.

Each :class:`Trace` is a short program with a racy case and, where it has one, its twin with
the sync restored. It runs on any :class:`model.device.Device`: the CPU tests run every trace
on ``SimDevice`` (that the expectations are right), the GPU tests and
``gpu_check/semantics_check.py`` on ``CudaDevice`` (that real streams agree). Costs are large
(``SLOW_US``) next to a Python launch, so the interleaving the expectation names is the one a
GPU runs: a slow writer is still sleeping when the racing reader goes.

``ordered`` holds the values under issue order (what the serial oracle computes); a race the
detector calls manifest must show as an observed value that differs from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from overlap_harness.model.device import Device, SyncLabel
from overlap_harness.model.trace import DeviceRun

SLOW_US = 2000.0  # far longer than issuing a few ops from Python
FAST_US = 5.0
I64 = torch.int64


def ints(*v: int) -> torch.Tensor:
    """An int64 tensor: the value an op writes."""
    return torch.tensor(v, dtype=I64)


def _nothing(*_v: Any) -> tuple[()]:
    return ()


Values = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Trace:
    """One semantics trace: the program, the race kinds expected, the issue-order values."""

    name: str
    run: Callable[[Device], Values]
    expect: tuple[str, ...]
    ordered: Values
    doc: str
    delays: Mapping[tuple[str, int], float] = field(default_factory=dict)


def _readback(dev: Device, b: Any, shape: tuple[int, ...]) -> list:
    """Race-free look at a device buffer at the end: sync everything, blocking copy, read."""
    s = dev.stream("schedule")
    pin = dev.buffer("readback", shape, I64, pinned=True, fill=0)
    dev.synchronize()
    dev.copy(s, b, pin, non_blocking=False)
    return dev.host_read(pin).tolist()


def _rows(rows: int, cols: int, **set_rows: int) -> list[list[int]]:
    out = [[0] * cols for _ in range(rows)]
    for r, v in set_rows.items():
        out[int(r[1:])] = [v] * cols
    return out


def _row_writes(first: list[int], second: list[int]) -> Callable[[Device], Values]:
    def run(dev: Device) -> Values:
        s, f = dev.stream("schedule"), dev.stream("forward")
        b = dev.buffer("b", (8, 4), I64, fill=0)
        dev.launch(s, "first_rows", lambda: ints(1), writes=[(b, first)], cost_us=SLOW_US)
        dev.launch(f, "second_rows", lambda: ints(2), writes=[(b, second)], cost_us=FAST_US)
        return {"b": _readback(dev, b, (8, 4))}
    return run


def _raw(sync: bool) -> Callable[[Device], Values]:
    def run(dev: Device) -> Values:
        s, f = dev.stream("schedule"), dev.stream("forward")
        b = dev.buffer("b", (4,), I64, fill=0)
        e = dev.event("e")
        dev.launch(s, "w", lambda: ints(5), writes=[(b, [0])], cost_us=SLOW_US)
        if sync:
            dev.record(e, s)
            dev.wait_event(f, e)
        dev.launch(f, "r", _nothing, reads=[(b, [0])], cost_us=FAST_US, observe="r")
        return {}
    return run


def _rerecord(dev: Device) -> Values:
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("b", (4,), I64, fill=0)
    e = dev.event("e")
    dev.launch(s, "w0", lambda: ints(1), writes=[(b, [0])], cost_us=FAST_US)
    dev.record(e, s)
    dev.wait_event(f, e)  # binds to the record covering w0
    dev.launch(s, "w1", lambda: ints(2), writes=[(b, [1])], cost_us=SLOW_US)
    dev.record(e, s)  # re-record: only waits issued after this see w1
    dev.launch(f, "r", _nothing, reads=[(b, [0, 1])], cost_us=FAST_US, observe="r")
    return {}


def _never_recorded(dev: Device) -> Values:
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("b", (4,), I64, fill=0)
    dev.launch(s, "w", lambda: ints(1), writes=[(b, [0])], cost_us=SLOW_US)
    dev.wait_event(f, dev.event("never"))
    dev.launch(f, "r", _nothing, reads=[(b, [0])], cost_us=FAST_US, observe="r")
    return {}


def _war(sync: bool) -> Callable[[Device], Values]:
    def run(dev: Device) -> Values:
        s, f = dev.stream("schedule"), dev.stream("forward")
        b = dev.buffer("b", (4,), I64, fill=0)
        dev.launch(f, "busy", _nothing, cost_us=SLOW_US)
        dev.launch(f, "read_old", _nothing, reads=[(b, [2])], cost_us=FAST_US,
                   observe="read_old")
        if sync:
            dev.wait_stream(s, f, label=SyncLabel.WAR_BARRIER)
        dev.launch(s, "clobber", lambda: ints(9), writes=[(b, [2])], cost_us=FAST_US)
        return {}
    return run


def _pinned_d2h(sync: bool) -> Callable[[Device], Values]:
    def run(dev: Device) -> Values:
        f = dev.stream("forward")
        b = dev.buffer("b", (4,), I64, fill=7, stream=f)
        pin = dev.buffer("pin", (4,), I64, pinned=True, fill=0)
        e = dev.event("copy_done")
        dev.copy(f, b, pin, non_blocking=True, cost_us=FAST_US)  # delayed by the trace
        dev.record(e, f)
        if sync:
            dev.synchronize(e)
        return {"pin": dev.host_read(pin).tolist()}
    return run


def _query(dev: Device) -> Values:
    s = dev.stream("schedule")
    pin = dev.buffer("pin", (2,), I64, pinned=True, fill=0)
    b = dev.buffer("b", (2,), I64, fill=3, stream=s)
    e = dev.event("e")
    dev.copy(s, b, pin, non_blocking=True, cost_us=FAST_US)
    dev.record(e, s)
    dev.host_work("spin", SLOW_US)  # long enough that the copy is done ...
    done = dev.query(e)  # ... yet the branch's default outcome is False, which orders nothing
    return {"query": done, "pin": dev.host_read(pin).tolist()}


REUSE_NUMEL = 1 << 18  # 2 MiB of int64: a size class of its own in the caching allocator


def _reuse(record: bool) -> Callable[[Device], Values]:
    def run(dev: Device) -> Values:
        s, f = dev.stream("schedule"), dev.stream("forward")
        idx = dev.buffer("future_indices", (REUSE_NUMEL,), I64, fill=1, stream=s)
        dev.wait_stream(f, s)
        dev.launch(f, "slow", _nothing, cost_us=SLOW_US)  # F is behind
        dev.launch(f, "gather", _nothing, reads=[(idx, slice(0, 4))], cost_us=FAST_US,
                   observe="gather")
        if record:
            dev.record_stream(idx, f, label=SyncLabel.FUTURE_INDICES_RECORD_STREAM)
        dev.free(idx)
        new = dev.buffer("next_indices", (REUSE_NUMEL,), I64, stream=s)
        dev.launch(s, "fill_next", lambda: 9, writes=[new], cost_us=FAST_US)
        return {}
    return run


DELAY_COPY = {("copy", -1): SLOW_US}

TRACES: tuple[Trace, ...] = (
    Trace("disjoint_rows", _row_writes([1, 2], [3, 4]), (), {"b": _rows(8, 4, r1=1, r2=1,
          r3=2, r4=2)}, "two streams write disjoint rows of one buffer: race-free"),
    Trace("overlapping_rows", _row_writes([1, 2], [2, 3]), ("WAW",),
          {"b": _rows(8, 4, r1=1, r2=2, r3=2)}, "two streams write rows 1-2 and 2-3: WAW on row 2"),
    Trace("raw_unsynced", _raw(False), ("RAW",), {"r": [5]},
          "a read on F of what a slow S kernel writes, no event"),
    Trace("raw_record_wait", _raw(True), (), {"r": [5]}, "the same with record + wait_event"),
    Trace("rerecord_after_wait", _rerecord, ("RAW",), {"r": [1, 2]},
          "a re-record after a wait does not extend what the wait waited for"),
    Trace("never_recorded_wait", _never_recorded, ("RAW",), {"r": [1]},
          "waiting on a never-recorded event is a no-op"),
    Trace("war_unsynced", _war(False), ("WAR",), {"read_old": [0]},
          "S clobbers what F has yet to read"),
    Trace("war_wait_stream", _war(True), (), {"read_old": [0]},
          "the same with wait_stream(S, F) first"),
    Trace("pinned_early_read", _pinned_d2h(False), ("host-D2H",), {"pin": [7, 7, 7, 7]},
          "the host reads pinned memory before a delayed non_blocking D2H lands",
          DELAY_COPY),
    Trace("pinned_event_sync", _pinned_d2h(True), (), {"pin": [7, 7, 7, 7]},
          "the same with event.synchronize() first", DELAY_COPY),
    Trace("query_orders_nothing", _query, ("host-D2H",), {"query": False, "pin": [3, 3]},
          "a branching query() takes the outcome that orders nothing (False) on both devices: "
          "the race the other outcome hides is reported"),
    Trace("reuse_no_record_stream", _reuse(False), ("reuse",), {"gather": [1, 1, 1, 1]},
          "freed while F still reads it; S's next buffer gets the block"),
    Trace("reuse_record_stream", _reuse(True), (), {"gather": [1, 1, 1, 1]},
          "the same with record_stream(F)"),
)


def by_name(name: str) -> Trace:
    """The trace called ``name``."""
    for t in TRACES:
        if t.name == name:
            return t
    raise KeyError(f"no trace {name!r}; known: {', '.join(t.name for t in TRACES)}")


class Finishing(Protocol):
    """A device that can finish a run (both SimDevice and CudaDevice do)."""

    observations: dict[tuple[str, int], list[torch.Tensor]]

    def finish(self) -> DeviceRun: ...


@dataclass(slots=True)
class Outcome:
    """What one run of a trace showed: the detector's races and the values seen."""

    trace: Trace
    run: DeviceRun
    values: Values

    @property
    def kinds(self) -> tuple[str, ...]:
        """Race kinds found, in issue order."""
        return tuple(str(r.kind) for r in self.run.races)

    @property
    def manifest(self) -> bool:
        """Whether the detector says some race showed in this run's timing."""
        return any(r.manifest for r in self.run.races)

    @property
    def values_differ(self) -> bool:
        """Whether some observed value differs from the issue-order one."""
        return any(self.values.get(k) != v for k, v in self.trace.ordered.items())


def run_trace(trace: Trace, dev: Any) -> Outcome:
    """Run ``trace`` on ``dev`` (built with ``trace.delays``), finish, gather the values."""
    host = trace.run(dev)
    run = dev.finish()
    values = dict(host)
    for (key, _it), vals in dev.observations.items():
        values[key] = [x for v in vals for x in v.reshape(-1).tolist()]
    return Outcome(trace, run, values)


def warm_up(make_device: Callable[[Trace], Any]) -> None:
    """Run every trace once and discard it. CUDA loads a kernel's module lazily at its first
    launch, and that load was seen to wait for the GPU to go idle, undoing a forced delay
    (a first-time gather on F waited out S's 2 ms sleep): measured runs come after this."""
    for t in TRACES:
        run_trace(t, make_device(t))
