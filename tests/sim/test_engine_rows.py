"""The engine's compact state: shadow arrays sized by the agents registered (grown for a
stream created after a block was first accessed), one read-only element-id array per shape,
and the refusals of a detector without history. Racy cases have their fixed twins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64


def late_stream_race(fence: bool) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """Stream s0 writes elements 1 and 2 of a block; only then is stream s1 created (the
    block's shadow arrays have no row for it yet) and it writes element 2, after an event
    wait on s0's write when ``fence``."""
    dev = SimDevice()
    s0 = dev.stream("s0")
    buf = dev.buffer("b", (4,), I64, stream=s0, fill=0)
    dev.launch(s0, "w0", lambda: torch.tensor([5, 6]), writes=[(buf, np.array([1, 2]))],
               cost_us=10)
    done = dev.event("done")
    dev.record(done, s0)
    s1 = dev.stream("s1")
    if fence:
        dev.wait_event(s1, done)
    dev.launch(s1, "w1", lambda: torch.tensor([7]), writes=[(buf, np.array([2]))])
    return [(str(r.kind), r.first.op_name, r.second.op_name, r.elements)
            for r in dev.finish().races]


def test_a_stream_created_after_a_blocks_first_access_races_on_it() -> None:
    # the fill is the older racing pair, behind w0 on the same stream
    assert late_stream_race(fence=False) == [("WAW", "fill:b", "w1", (2,)),
                                             ("WAW", "w0", "w1", (2,))]


def test_a_stream_created_after_a_blocks_first_access_race_fixed_by_a_wait() -> None:
    assert late_stream_race(fence=True) == []


def test_element_ids_are_shared_per_shape_and_read_only() -> None:
    dev = SimDevice()
    a = dev.buffer("a", (2, 3), I64, fill=0)
    b = dev.buffer("b", (2, 3), I64, fill=0)
    c = dev.buffer("c", (6,), I64, fill=0)
    assert a.ids is b.ids and a.ids is not c.ids
    assert a.ids.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError):
        a.ids[0, 0] = 9


def test_without_history_the_graph_and_happens_before_refuse() -> None:
    dev = SimDevice(history=False)
    s = dev.stream("s")
    dev.buffer("a", (2,), I64, stream=s, fill=0)
    run = dev.finish()
    assert run.timeline == [] and dev.op_count == 1
    with pytest.raises(DeviceUsageError, match="keeps no history"):
        dev.det.graph()
    with pytest.raises(DeviceUsageError, match="keeps no history"):
        dev.det.happens_before(0, 0)


def test_with_history_the_graph_has_every_node() -> None:
    dev = SimDevice()
    s = dev.stream("s")
    dev.buffer("a", (2,), I64, stream=s, fill=0)
    dev.finish()
    assert dev.det.graph().number_of_nodes() == dev.op_count == 1
