"""The detector against brute force: random device-API programs, every access pair checked by
reachability on the exported happens-before graph.

For each access q, element e and other agent X, brute force asks: is there an earlier access p
by X to e, at least one of p and q a write, with no path p -> q in the graph? The detector must
report exactly those (q, X, e) triples (it reports against X's latest conflicting access)."""

from __future__ import annotations

import networkx as nx
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from overlap_harness.model.trace import HOST
from overlap_harness.sim.sim_device import SimDevice

N = 6
STREAMS = ("s0", "s1", "s2")
elems = st.lists(st.integers(0, N - 1), min_size=1, max_size=3, unique=True)


class DetectorVsReachability(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dev = SimDevice(host_launch_us=1.0)
        self.streams = [self.dev.stream(n) for n in STREAMS]
        self.events = [self.dev.event(f"e{i}") for i in range(2)]
        self.bufs = [self.dev.buffer(f"d{i}", (N,), torch.int64, fill=0) for i in range(2)]
        self.pin = self.dev.buffer("pin", (N,), torch.int64, pinned=True, fill=0)
        self.log: list[tuple[int, str, str, frozenset[int], bool]] = []

    def _note(self, op: int, agent: str, buf: str, es, write: bool) -> None:
        self.log.append((op, agent, buf, frozenset(es), write))

    @rule(s=st.integers(0, 2), b=st.integers(0, 1), r=elems, w=elems, cost=st.integers(0, 30))
    def launch(self, s, b, r, w, cost) -> None:
        buf = self.bufs[b]
        self.dev.launch(self.streams[s], "k", lambda v: torch.zeros(len(w), dtype=torch.int64),
                        reads=[(buf, r)], writes=[(buf, w)], cost_us=cost)
        op = self.dev.timeline[-1].op
        self._note(op, STREAMS[s], buf.name, r, False)
        self._note(op, STREAMS[s], buf.name, w, True)

    @rule(s=st.integers(0, 2), b=st.integers(0, 1), blocking=st.booleans())
    def d2h(self, s, b, blocking) -> None:
        self.dev.copy(self.streams[s], self.bufs[b], self.pin, non_blocking=not blocking,
                      cost_us=5)
        op = next(t.op for t in reversed(self.dev.timeline) if t.name == "copy")
        self._note(op, STREAMS[s], self.bufs[b].name, range(N), False)
        self._note(op, STREAMS[s], "pin", range(N), True)

    @rule(e=elems, write=st.booleans())
    def host_access(self, e, write) -> None:
        if write:
            self.dev.host_write(self.pin, e, 1)
        else:
            self.dev.host_read(self.pin, e)
        self._note(self.dev.timeline[-1].op, HOST, "pin", e, write)

    @rule(ev=st.integers(0, 1), s=st.integers(0, 2))
    def record(self, ev, s) -> None:
        self.dev.record(self.events[ev], self.streams[s])

    @rule(ev=st.integers(0, 1), s=st.integers(0, 2))
    def wait_event(self, ev, s) -> None:
        self.dev.wait_event(self.streams[s], self.events[ev])

    @rule(a=st.integers(0, 2), b=st.integers(0, 2))
    def wait_stream(self, a, b) -> None:
        if a != b:
            self.dev.wait_stream(self.streams[a], self.streams[b])

    @rule(what=st.sampled_from(["device", "s0", "s1", "s2", "e0", "e1"]))
    def synchronize(self, what) -> None:
        if what == "device":
            self.dev.synchronize()
        elif what.startswith("s"):
            self.dev.synchronize(self.streams[int(what[1])])
        else:
            self.dev.synchronize(self.events[int(what[1])])

    @rule(ev=st.integers(0, 1))
    def query(self, ev) -> None:
        self.dev.query(self.events[ev])

    @precondition(lambda self: len(self.log) > 0)
    @invariant()
    def detector_equals_brute_force(self) -> None:
        g = self.dev.det.graph()
        reach = {n: nx.descendants(g, n) for n in g.nodes}
        expected = set()
        for j, (qop, qa, qb, qe, qw) in enumerate(self.log):
            for pop, pa, pb, pe, pw in self.log[:j]:
                if pa == qa or pb != qb or not (pw or qw) or qop in reach[pop]:
                    continue
                expected |= {(qop, pa, qb, e) for e in pe & qe}
        found = {(r.second.op, r.first.agent, r.buffer, e)
                 for r in self.dev.det.races for e in r.elements}
        assert found == expected


DetectorVsReachability.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, derandomize=True, deadline=None)
TestDetectorVsReachability = DetectorVsReachability.TestCase
