"""The serial oracle without shadow memory (``SimDevice(serial=True, shadow=False)``, the
runner's oracle call): skipping the element checks is safe only because a serial run has no
unordered pair, so the full detector on the same serial runs must find no race, and the two
runs must agree on everything else (values, observations, timeline, device-defined faults).
The flag itself is checked on the detector alone, with its racy case (checked) and twin
(unchecked). The protocol cases are racy overlapped runs (a sync removed, recycled rows)."""

from __future__ import annotations

import dataclasses as dc

import numpy as np
import pytest
import torch

from overlap_harness.model.config import (
    Gather,
    ProtocolConfig,
    Request,
    SeqLensSync,
    Timing,
    WarBarrier,
    Workload,
)
from overlap_harness.model.detector import HBDetector
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.protocol import compare_runs, run_protocol
from overlap_harness.model.trace import RaceKind
from overlap_harness.sim.sim_device import SimDevice

R = Request
RECYCLE = Workload(iterations=8, requests=(R("A", 0, 10, 2), R("B", 0, 6, 40), R("C", 3, 5, 40)))
CASES = [
    ("ref_fused", ProtocolConfig(debug_poison=True), ()),
    ("no_war_barrier", ProtocolConfig(gather=Gather.UNFUSED), ("war_barrier",)),
    ("legacy_no_schedule_wait", ProtocolConfig(gather=Gather.UNFUSED, war_barrier=WarBarrier.NONE,
                                               seq_lens_sync=SeqLensSync.VERIFY_DONE),
     ("verify_done.schedule_wait",)),
]


def _serial(proto: ProtocolConfig, removed: tuple[str, ...], shadow: bool):
    dev = SimDevice(removed=removed, serial=True, shadow=shadow)
    out = run_protocol(dev, (proto, RECYCLE, Timing()))
    run = dev.finish()
    timeline = [dc.astuple(t) for t in run.timeline]
    return out, dev.observations, run, timeline


@pytest.mark.parametrize(("proto", "removed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_serial_run_has_no_race_so_skipping_the_checks_changes_nothing(proto, removed) -> None:
    out, obs, run, timeline = _serial(proto, removed, shadow=True)
    assert run.races == []  # the premise: with every check on, a serial run races nowhere
    s_out, s_obs, s_run, s_timeline = _serial(proto, removed, shadow=False)
    assert compare_runs(out, obs, s_out, s_obs) == []
    assert s_timeline == timeline and len(timeline) > 100
    assert (s_run.uninit_reads, s_run.dup_writes) == (run.uninit_reads, run.dup_writes)
    # the overlapped run of the same program does race (so the workload exercises the checks)
    if removed:
        dev = SimDevice(removed=removed)
        run_protocol(dev, (proto, RECYCLE, Timing()))
        assert dev.finish().races != []


def test_drain_lands_the_work_finish_would() -> None:
    dev = SimDevice(serial=True, shadow=False)
    s = dev.stream("s")
    b = dev.buffer("b", (3,), torch.int64, fill=0)
    dev.launch(s, "w", lambda v: v + 5, reads=[b], writes=[b], cost_us=4)
    dev.drain()
    assert dev.value(b).tolist() == [5, 5, 5]


def test_shadow_off_needs_serial() -> None:
    with pytest.raises(DeviceUsageError, match="shadow=False needs serial=True"):
        SimDevice(shadow=False)


def _two_unordered_writes(shadow: bool) -> HBDetector:
    """Two streams write element 0 of one block with no edge between them."""
    det = HBDetector(shadow=shadow)
    first, second = det.add_agent("s0"), det.add_agent("s1")
    det.add_storage(0, 4, (4,))
    e = np.array([0])
    for op, agent in enumerate((first, second)):
        det.feed((op, f"w{op}", agent, f"s{op}", 0, 0, "src", None, 0, 0),
                 ((0, 0, "buf", e, True, False),))
    return det


def test_detector_checks_elements_with_shadow() -> None:
    races = _two_unordered_writes(shadow=True).races
    assert [(r.kind, r.buffer) for r in races] == [(RaceKind.WAW, "buf")]


def test_detector_without_shadow_skips_the_check_but_keeps_the_clocks() -> None:
    det = _two_unordered_writes(shadow=False)
    assert det.races == []
    assert det.node_epoch.tolist() == [1, 1] and not det.host_knows(0)
    det.feed((2, "sync", 0, "host", 4, 0, "src", None, 0, 0), (), joins=(0,))
    assert det.host_knows(0) and not det.host_knows(1)
