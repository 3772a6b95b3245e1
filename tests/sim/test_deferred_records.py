"""A run's records are built when first read (``DeviceRun``), and they are those of the run
as ``finish`` returned it: ops issued and races found after ``finish`` do not leak in, and a
run read late equals one read at once. Racy programs have their fenced twins."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import torch

from overlap_harness.model.trace import DeviceRun
from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64


def two_writers(dev: SimDevice, fence: bool, tag: str) -> None:
    """Streams a and b write element 1 of one buffer, b behind an event on a when ``fence``."""
    a, b = dev.stream("a"), dev.stream("b")
    buf = dev.buffer(f"buf{tag}", (4,), I64, stream=a, fill=0)
    dev.launch(a, f"wa{tag}", lambda: torch.tensor([5]), writes=[(buf, np.array([1]))],
               cost_us=10)
    if fence:
        done = dev.event(f"done{tag}")
        dev.record(done, a)
        dev.wait_event(b, done)
    dev.launch(b, f"wb{tag}", lambda: torch.tensor([7]), writes=[(buf, np.array([1]))])


def summary(run: DeviceRun) -> tuple[list, list]:
    return ([(r.op, r.name, r.agent, str(r.kind)) for r in run.timeline],
            [(str(r.kind), r.first.op_name, r.second.op_name, r.elements) for r in run.races])


def test_records_read_late_are_those_of_the_run_finish_returned() -> None:
    for fence in (False, True):
        eager_dev = SimDevice()
        two_writers(eager_dev, fence, "0")
        eager = eager_dev.finish()
        eager_summary = summary(eager)  # read at once
        late_dev = SimDevice()
        two_writers(late_dev, fence, "0")
        late = late_dev.finish()
        two_writers(late_dev, False, "1")  # more ops, racing ones, after finish
        later = late_dev.finish()
        assert summary(late) == eager_summary
        assert late == eager
        names = {r.name for r in later.timeline}
        assert "wb1" in names and "wb1" not in {r.name for r in late.timeline}
        # the unfenced second round races; the first round's pairs come first, unchanged
        assert later.races[:len(late.races)] == late.races
        assert len(later.races) > len(late.races)
        first_round = summary(late)[1]
        assert (("WAW", "wa0", "wb0", (1,)) in first_round) == (not fence)
        assert not fence or first_round == []


def test_a_run_built_from_lists_or_builders_compares_by_its_records() -> None:
    dev = SimDevice()
    two_writers(dev, False, "0")
    run = dev.finish()
    listed = DeviceRun(list(run.timeline), list(run.races), run.skipped_syncs, run.end_ns,
                       run.uninit_reads, run.dup_writes, run.query_sites)
    assert listed == run and listed.races == run.races
    listed.races = []
    assert listed != run and listed.races == []
    assert "races=[]" in repr(listed)


def test_a_deferred_run_pickles_and_copies_with_its_records() -> None:
    dev = SimDevice()
    two_writers(dev, False, "0")
    run = dev.finish()
    two_writers(dev, False, "1")  # issued after finish: not in the run
    sent = pickle.loads(pickle.dumps(run))
    assert sent == run and summary(sent) == summary(run)
    assert "wb1" not in {r.name for r in sent.timeline}
    assert copy.deepcopy(run) == run
