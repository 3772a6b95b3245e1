"""The detector against an oracle that shares no code with it (issue 13).

Random small programs (three streams, the host, two events, a pinned buffer, three device
buffer slots that are allocated, freed and reused, record_stream, blocking and non-blocking
copies, the three synchronizes, branching queries with both outcomes, poll loops) run on the
simulated device under a random timing; :class:`tests.properties.hb_oracle.ProgramOracle`
builds happens-before from STREAM-SEMANTICS.md's rules by explicit reachability and lists every
racing pair. The two race sets must be equal, element by element, pair by pair (older pairs
included), and must not change when the timing does. Each program runs under both shadow
memories of the detector, the compiled pass and the per-access checks (``model/shadow*.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_harness.model import detector as detector_module
from overlap_harness.sim.sim_device import SimDevice
from tests.properties.hb_oracle import ProgramOracle

N = 4
STREAMS = ("s0", "s1", "s2")
EVENTS = ("e0", "e1")
SLOTS = 3
I64 = torch.int64

elements = st.lists(st.integers(0, N - 1), min_size=1, max_size=3, unique=True)
stream = st.sampled_from(STREAMS)
slot = st.integers(0, SLOTS - 1)
target = st.sampled_from(["pin", "slot"])
step = st.one_of(
    st.tuples(st.just("launch"), stream, target, slot, elements, elements, st.integers(0, 40)),
    st.tuples(st.just("copy"), stream, slot, st.booleans(), st.booleans(), st.integers(0, 40)),
    st.tuples(st.just("d2d"), stream, slot, slot, st.integers(0, 40)),
    st.tuples(st.just("host"), elements, st.booleans(), st.integers(0, 30)),
    st.tuples(st.just("record"), st.sampled_from(EVENTS), stream),
    st.tuples(st.just("wait"), stream, st.sampled_from(EVENTS)),
    st.tuples(st.just("wait_stream"), stream, stream),
    st.tuples(st.just("sync"), st.sampled_from(["device", *STREAMS, *EVENTS])),
    st.tuples(st.just("query"), st.sampled_from(EVENTS), st.booleans()),
    st.tuples(st.just("poll"), st.sampled_from(EVENTS)),
    st.tuples(st.just("free"), slot),
    st.tuples(st.just("alloc"), slot, stream),
    st.tuples(st.just("record_stream"), slot, stream),
    st.tuples(st.just("recycle"), slot),  # free, then allocate again on the same stream
)
programs = st.lists(step, min_size=10, max_size=40)


def _zeros(count: int):
    return lambda _value: torch.zeros(count, dtype=I64)


class _Runner:
    """Runs raw steps on a SimDevice, skipping the ones invalid in the current state (an
    access to a freed slot), and logs the executed steps in the oracle's terms."""

    def __init__(self, raw: list[tuple], scale: float, host_us: float) -> None:
        self.raw, self.scale = raw, scale
        occurrences: dict[str, int] = {}
        outcomes = {}
        for s in raw:
            if s[0] == "query":
                occurrence = occurrences.get(s[1], 0)
                occurrences[s[1]] = occurrence + 1
                outcomes[(s[1], -1, occurrence)] = s[2]
        self.dev = SimDevice(host_launch_us=host_us, query_outcomes=outcomes)
        self.streams = {n: self.dev.stream(n) for n in STREAMS}
        self.events = {n: self.dev.event(n) for n in EVENTS}
        self.pin = self.dev.buffer("pin", (N,), I64, pinned=True)
        self.executed: list[tuple] = [("alloc_pin",)]
        self.slots: list = []
        self.owners: list[str] = []
        self.generation = 0
        for index in range(SLOTS):
            self.slots.append(None)
            self._alloc(index, STREAMS[index])

    def _alloc(self, index: int, stream_name: str) -> None:
        name = f"d{index}_{self.generation}"
        self.generation += 1
        self.slots[index] = self.dev.buffer(name, (N,), I64, stream=self.streams[stream_name])
        self.owners[index:index + 1] = [stream_name]
        self.executed.append(("alloc", name, stream_name))

    def run(self) -> list[tuple]:
        dev = self.dev
        for i, s in enumerate(self.raw):
            what = s[0]
            if what == "launch":
                _, sn, tgt, index, reads, writes, cost = s
                buf = self.pin if tgt == "pin" else self.slots[index]
                if buf is None:
                    continue
                dev.launch(self.streams[sn], f"k{i}", _zeros(len(writes)),
                           reads=[(buf, reads)], writes=[(buf, writes)],
                           cost_us=cost * self.scale)
                self.executed.append(("launch", sn, f"k{i}", buf.name, buf.pinned, reads, writes))
            elif what in ("copy", "d2d"):
                if what == "copy":
                    _, sn, index, to_host, blocking, cost = s
                    dev_buf = self.slots[index]
                    src, dst = (dev_buf, self.pin) if to_host else (self.pin, dev_buf)
                else:
                    _, sn, a, b, cost = s
                    src, dst, blocking = self.slots[a], self.slots[b], False
                if src is None or dst is None or src is dst:
                    continue
                dev.copy(self.streams[sn], src, dst, non_blocking=not blocking,
                         cost_us=cost * self.scale, name=f"c{i}")
                self.executed.append(("copy", sn, f"c{i}", src.name, src.pinned, dst.name,
                                      dst.pinned, blocking))
            elif what == "host":
                _, elems, write, cost = s
                if write:
                    dev.host_write(self.pin, elems, 1, name=f"h{i}")
                else:
                    dev.host_read(self.pin, elems, name=f"h{i}")
                dev.host_work(f"w{i}", cost * self.scale)
                self.executed.append(("host", f"h{i}", "pin", elems, write))
            elif what == "record":
                dev.record(self.events[s[1]], self.streams[s[2]])
                self.executed.append(s)
            elif what == "wait":
                dev.wait_event(self.streams[s[1]], self.events[s[2]])
                self.executed.append(s)
            elif what == "wait_stream":
                if s[1] == s[2]:
                    continue
                dev.wait_stream(self.streams[s[1]], self.streams[s[2]])
                self.executed.append(s)
            elif what == "sync":
                tgt = s[1]
                dev.synchronize(None if tgt == "device" else self.streams.get(tgt)
                                or self.events[tgt])
                self.executed.append(s)
            elif what == "query":
                answer = dev.query(self.events[s[1]])
                self.executed.append(("query", s[1], answer))
            elif what == "poll":
                dev.poll(self.events[s[1]])
                self.executed.append(s)
            elif what == "free":
                buf = self.slots[s[1]]
                if buf is None:
                    continue
                dev.free(buf)
                self.slots[s[1]] = None
                self.executed.append(("free", buf.name))
            elif what == "alloc":
                if self.slots[s[1]] is None:
                    self._alloc(s[1], s[2])
            elif what == "recycle":
                buf = self.slots[s[1]]
                if buf is not None:
                    dev.free(buf)
                    self.executed.append(("free", buf.name))
                self._alloc(s[1], self.owners[s[1]])
            elif what == "record_stream":
                buf = self.slots[s[1]]
                if buf is None:
                    continue
                dev.record_stream(buf, self.streams[s[2]])
                self.executed.append(("record_stream", buf.name, s[2]))
        return self.executed


def detector_races(dev: SimDevice) -> set[tuple]:
    """The detector's races in the oracle's form, one entry per element."""
    return {(str(r.kind), r.buffer, r.reused_as or r.buffer, r.first.op_name,
             r.second.op_name, e) for r in dev.finish().races for e in r.elements}


def oracle_races(executed: list[tuple]) -> set[tuple]:
    """The oracle's races for the executed steps."""
    oracle = ProgramOracle(STREAMS, N)
    for s in executed:
        if s[0] == "alloc_pin":
            oracle.allocate("pin", None, True)
        elif s[0] == "alloc":
            oracle.allocate(s[1], s[2], False)
        else:
            oracle.apply(s)
    return oracle.races()


@contextmanager
def shadow_memory(checks: str) -> Iterator[None]:
    """Every detector made inside uses ``checks`` (its ``DEFAULT_CHECKS`` while inside)."""
    before = detector_module.DEFAULT_CHECKS
    detector_module.DEFAULT_CHECKS = checks
    try:
        yield
    finally:
        detector_module.DEFAULT_CHECKS = before


@pytest.mark.parametrize("checks", ["compiled", "per_access"])
@settings(max_examples=400, derandomize=True, deadline=None)
@given(program=programs, scale=st.sampled_from([0.25, 1.0, 4.0]),
       host_us=st.sampled_from([1.0, 20.0]))
def test_detector_equals_the_independent_oracle(checks, program, scale, host_us) -> None:
    with shadow_memory(checks):
        runner = _Runner(program, scale, host_us)
        executed = runner.run()
        assert runner.dev.det.checks == checks
        assert detector_races(runner.dev) == oracle_races(executed)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(program=programs)
def test_the_race_set_of_a_program_does_not_depend_on_its_timing(program) -> None:
    sets = []
    for scale, host_us in ((0.25, 1.0), (4.0, 1.0), (1.0, 20.0)):
        runner = _Runner(program, scale, host_us)
        runner.run()
        sets.append(detector_races(runner.dev))
    assert sets[0] == sets[1] == sets[2]
