"""The detector without history (``SimDevice(history=False)``) finds the same races as with
it, and keeps bounded memory.

The random programs of test_detector_oracle (streams, events, allocation and reuse,
record_stream, copies, syncs, queries, polls) run twice, with and without history, with old
history dropped after every node so that every drop is exercised; the full race records
(kind, buffer, elements, both accesses, manifest, older) must be equal. The twin: a detector
that dropped too much (nodes some agent can still race with) loses races, and the check
sees it. A long synthetic run shows the bound: the memory kept per op without history is a
small fraction of what history keeps.
"""

from __future__ import annotations

import functools
import gc
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import overlap_harness.model.detector as detector_module
from overlap_harness.model import shadow
from overlap_harness.sim.sim_device import SimDevice
from tests.properties import test_detector_oracle as oracle_tests


def race_records(dev: SimDevice) -> list[tuple]:
    """Every race of a run as plain values (the Race records compare by value)."""
    return [(str(r.kind), r.buffer, r.shape, r.elements, r.first, r.second, r.manifest,
             r.reused_as, r.older) for r in dev.finish().races]


def run_program(program: list[tuple], history: bool, monkeypatch: pytest.MonkeyPatch) -> list:
    with monkeypatch.context() as patch:
        patch.setattr(oracle_tests, "SimDevice", functools.partial(SimDevice, history=history))
        runner = oracle_tests._Runner(program, 1.0, 1.0)
        runner.run()
        return race_records(runner.dev)


@settings(max_examples=150, derandomize=True, deadline=None)
@given(program=oracle_tests.programs)
def test_no_history_finds_the_same_races(program) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(detector_module, "DROP_HISTORY_EVERY", 1)  # drop after every node
        assert run_program(program, False, patch) == run_program(program, True, patch)


def synthetic(history: bool, iterations: int, racy: bool = True) -> SimDevice:
    """Three streams, kernels on random index sets of two buffers, a host sync every tenth
    iteration; with ``racy``, the forward stream never waits for the schedule stream and a
    fence back is dropped now and then (races)."""
    rng = np.random.default_rng(0)
    dev = SimDevice(host_launch_us=2.0, history=history)
    s, f, d = (dev.stream(n) for n in ("s", "f", "d"))
    bufs = [dev.buffer(f"b{i}", (256,), torch.int64, fill=0) for i in range(2)]
    out = torch.zeros(8, dtype=torch.int64)
    for it in range(iterations):
        for stream in (s, f, f):
            if stream is f and not racy:
                dev.wait_stream(f, s)
            b = bufs[int(rng.integers(2))]
            dev.launch(stream, "k", lambda v: out, reads=[(b, rng.choice(256, 8, replace=False))],
                       writes=[(b, rng.choice(256, 8, replace=False))], cost_us=3)
        if rng.random() > 0.1 or not racy:
            dev.wait_stream(s, f)
        dev.wait_stream(d, f)
        if it % 10 == 9:
            dev.synchronize()
    return dev


def test_dropping_nodes_that_can_still_race_loses_races(monkeypatch) -> None:
    """The twin: a drop floor one epoch too high throws away nodes that still race."""
    want = race_records(synthetic(True, 60))
    assert want
    assert race_records(synthetic(False, 60)) == want

    def too_eager(self, n_agents: int) -> None:
        self._fed_since_drop = 0
        rows, accesses, clocks = self.nodes._rows, self.node_accesses._rows, self.node_vc
        for agent in range(n_agents):
            live = self._live[agent]
            floor = min(self._vc[x][agent] for x in range(n_agents)) + 1
            while live and self.node_epoch[live[0]] <= floor:
                op = live.popleft()
                rows[op] = accesses[op] = clocks[op] = None

    monkeypatch.setattr(detector_module.HBDetector, "_drop_history", too_eager)
    monkeypatch.setattr(detector_module, "DROP_HISTORY_EVERY", 1)
    with pytest.raises(TypeError):  # a race names a dropped node: its row is gone
        race_records(synthetic(False, 60))


def kept_bytes(history: bool, iterations: int) -> int:
    tracemalloc.start()
    dev = synthetic(history, iterations, racy=False)
    dev.drain()  # every op started and landed
    dev.det.check_queued()
    assert not dev.det._found  # race records are output: kept either way
    gc.collect()  # cyclic garbage not yet collected is not kept (when it goes depends on the
    # collector's state, which the tests before this one set)
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return kept


def test_memory_without_history_grows_far_less_per_op() -> None:
    # a long run moves its checks to the compiled pass, whose first load in a process (numba's
    # import and code cache, about 32 MB traced) would land in whichever run came first; load
    # it before measuring, so the result does not depend on which tests ran before this one
    if shadow.compiled_available():
        shadow.warm_up()
    kept_bytes(False, 300)
    kept_bytes(True, 300)
    with_history = kept_bytes(True, 1200) - kept_bytes(True, 300)
    without = kept_bytes(False, 1200) - kept_bytes(False, 300)
    ops = 900 * 11  # the marginal ops: 3 kernels, 4 wait_streams (2 nodes each) per iteration
    # history: node rows, element arrays, clocks, edges (about 630 B/op measured); without:
    # a few array and list slots per op (about 40 B/op)
    assert with_history / ops > 300
    assert without / ops < 64
