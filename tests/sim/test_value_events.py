"""The value engine's one event per op keeps the order two events per op gave: at one
instant writes land before reads start, and among equal-time writes (or reads) issue order
decides, whichever op's event was pushed into simpy's heap first. Each case has its twin with
the issue order swapped, and the detector reports the race both times (values show the
order; the verdict does not depend on it)."""

from __future__ import annotations

import torch

from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import assert_races, ints


def equal_time_writes(first_issued: str) -> int:
    """Ops "a" and "b" on two streams write element 0 and both end at 5 µs (issued at 1 and
    2 µs; the fills are host writes, which cost no launch). Returns what element 0 holds."""
    dev = SimDevice(host_launch_us=1.0)
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("b", (2,), torch.int64, fill=0)
    second = "b" if first_issued == "a" else "a"
    value = {"a": 1, "b": 2}
    for stream, name, cost in ((s, first_issued, 4), (f, second, 3)):
        dev.launch(stream, name, lambda v=value[name]: ints(v), writes=[(b, [0])], cost_us=cost)
    ends = {t.name: t.end_ns for t in dev.timeline if t.name in ("a", "b")}
    assert ends == {"a": 5000, "b": 5000}
    assert_races(dev, 1, "WAW")
    return int(dev.value(b)[0])


def test_equal_time_writes_land_in_issue_order() -> None:
    assert equal_time_writes("a") == 2  # b's value: issued later, it lands later


def test_equal_time_writes_land_in_issue_order_twin_swapped() -> None:
    assert equal_time_writes("b") == 1  # a's value


def read_against_write(write_cost: int, write_ends: int, read_first: bool) -> int:
    """A write "w" of 7 (``write_cost`` µs, ending at ``write_ends`` µs) on one stream and a
    read "r" starting at 10 µs on another, placed by injected delays; the two ops are issued
    at 1 and 2 µs in either order. Returns what the read saw."""
    issue = {"r": 1, "w": 2} if read_first else {"w": 1, "r": 2}
    delays = {("r", -1): 10 - issue["r"], ("w", -1): write_ends - write_cost - issue["w"]}
    dev = SimDevice(host_launch_us=1.0, delays=delays)
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("b", (2,), torch.int64, fill=0)
    seen = dev.buffer("seen", (1,), torch.int64, fill=0)
    read = (s, "r", lambda v: v[:1], [(b, [0])], [seen], 1)
    write = (f, "w", lambda: ints(7), [], [(b, [0])], write_cost)
    for stream, name, fn, reads, writes, cost in (read, write) if read_first else (write, read):
        dev.launch(stream, name, fn, reads=reads, writes=writes, cost_us=cost)
    times = {t.name: (t.issue_ns, t.start_ns, t.end_ns) for t in dev.timeline}
    assert times["r"][:2] == (issue["r"] * 1000, 10_000)
    assert times["w"][0] == issue["w"] * 1000 and times["w"][2] == write_ends * 1000
    assert_races(dev, 1, "RAW" if not read_first else "WAR")
    dev.finish()
    return int(dev.value(seen)[0])


def test_a_write_landing_at_a_reads_start_is_seen_in_either_issue_order() -> None:
    for write_cost in (0, 2):  # no length: one event at its end; else its end pushed later
        for read_first in (False, True):
            assert read_against_write(write_cost, 10, read_first) == 7, (write_cost, read_first)


def test_a_write_landing_after_a_reads_start_is_not_seen() -> None:
    # twin: the write ends 1 µs after the read starts
    for write_cost in (0, 2):
        for read_first in (False, True):
            assert read_against_write(write_cost, 11, read_first) == 0, (write_cost, read_first)


def host_reads_at(host_wait_us: float) -> int:
    """Op "w" writes 7 into pinned memory from 1 to 6 µs; the host, at 1 µs after issuing
    it, works ``host_wait_us`` and then reads. Returns what it read."""
    dev = SimDevice(host_launch_us=1.0)
    s = dev.stream("schedule")
    pin = dev.buffer("pin", (1,), torch.int64, pinned=True, fill=0)
    dev.launch(s, "w", lambda: ints(7), writes=[pin], cost_us=5)
    dev.host_work("wait", host_wait_us)
    return int(dev.host_read(pin)[0])


def test_the_host_sees_a_write_that_lands_at_its_clock() -> None:
    assert host_reads_at(5.0) == 7  # the landing at 6 µs is drained before the read at 6 µs


def test_the_host_does_not_see_a_write_that_lands_after_its_clock() -> None:
    assert host_reads_at(4.999) == 0  # twin: 1 ns short of the landing
