"""WAR-barrier placements (model/protocol/barrier.py) and the relay faults (faults.py).

Each placement is checked by where its syncs land in the timeline the device computed (which
stream, right after which op), and the placement added as the worked example
(``after_replay_prepare``) by the race it lets through, beside its twin (``read_done``) that
is race-free on the same workload.
"""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import (
    EventKind,
    FutureLayout,
    Mode,
    Platform,
    ProtocolConfig,
    Request,
    StashStream,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.protocol.barrier import (
    PLACEMENTS,
    AfterReplayPrepare,
    BarrierPlacement,
    LoopTop,
    placement_for,
)
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.faults import (
    RowFaults,
    SideStreamStash,
    StashAfterNextGather,
    future_map_for,
)
from overlap_harness.model.protocol.future_map import FutureMap, RingFutureMap
from overlap_harness.model.trace import OpRecord, RaceKind
from overlap_harness.sim.sim_device import SimDevice

R = Request
# A finishes after 2 tokens while still scheduled; C arrives at 3 and gets A's row (§9.8)
RECYCLE = Workload(iterations=8, requests=(R("A", 0, 10, 2), R("B", 0, 6, 40), R("C", 3, 5, 40)))
STEADY = Workload(iterations=4, requests=(R("A", 0, 10, 40),))


def timeline(proto: ProtocolConfig, wl: Workload = RECYCLE) -> tuple[list[OpRecord], list]:
    dev = SimDevice()
    run_protocol(dev, (proto, wl, Timing()))
    run = dev.finish()
    return run.timeline, run.races


def barrier_ops(ops: list[OpRecord], iteration: int) -> list[tuple[str, str]]:
    """(op, stream) of the iteration's barrier syncs: the labelled waits and their records,
    and the one-shot read_done record."""
    return [(o.name, o.agent) for o in ops if o.iteration == iteration
            and (o.label == "war_barrier" or o.name == "record:read_done")]


def op_before(ops: list[OpRecord], iteration: int, stream: str, name: str) -> str:
    """The op ``stream`` ran right before ``name`` in ``iteration``."""
    names = [o.name for o in ops if o.iteration == iteration and o.agent == stream]
    return names[names.index(name) - 1]


WAIT_ALL = [("record:forward->schedule", "forward"), ("wait:forward->schedule", "schedule")]
WAIT_EVENT = [("wait:read_done", "schedule"), ("record:read_done", "forward")]


@pytest.mark.parametrize(("barrier", "mode", "syncs", "recorded_after"), [
    (WarBarrier.NONE, Mode.SPEC_V2, [], None),
    (WarBarrier.LOOP_TOP, Mode.SPEC_V2, WAIT_ALL, None),
    (WarBarrier.AFTER_LAUNCH, Mode.SPEC_V2, WAIT_ALL, None),
    (WarBarrier.READ_DONE, Mode.SPEC_V2, WAIT_EVENT, "record:publish_ready"),
    (WarBarrier.READ_DONE, Mode.NON_SPEC, WAIT_EVENT, "decode_forward"),
    (WarBarrier.AFTER_REPLAY_PREPARE, Mode.SPEC_V2, WAIT_EVENT, "verify_out_cache_loc"),
    (WarBarrier.AFTER_REPLAY_PREPARE, Mode.NON_SPEC, WAIT_ALL, None),
], ids=lambda v: getattr(v, "value", None))
def test_each_placement_syncs_at_its_points(barrier, mode, syncs, recorded_after) -> None:
    ops, _ = timeline(ProtocolConfig(war_barrier=barrier, mode=mode))
    assert barrier_ops(ops, 2) == syncs
    if recorded_after is not None:
        assert op_before(ops, 2, "forward", "record:read_done") == recorded_after


def test_loop_top_waits_first_and_after_launch_follows_the_launch() -> None:
    top, _ = timeline(ProtocolConfig(war_barrier=WarBarrier.LOOP_TOP))
    first = [o.name for o in top if o.iteration == 2][:2]
    assert first == ["record:forward->schedule", "wait:forward->schedule"]
    after, _ = timeline(ProtocolConfig(war_barrier=WarBarrier.AFTER_LAUNCH))
    assert op_before(after, 2, "forward", "record:forward->schedule") == "record:copy_done"


def test_after_replay_prepare_lets_verify_race_a_recycled_row_read_done_does_not() -> None:
    _, races = timeline(ProtocolConfig(war_barrier=WarBarrier.AFTER_REPLAY_PREPARE))
    assert {(r.kind, r.buffer) for r in races} == {(RaceKind.WAR, "req_to_token")}
    assert {(r.first.op_name, r.second.op_name) for r in races} == {("verify", "prefill_alloc")}
    _, twin = timeline(ProtocolConfig(war_barrier=WarBarrier.READ_DONE))
    assert twin == []


def test_after_replay_prepare_non_spec_is_race_free_and_racy_without_its_wait() -> None:
    proto = ProtocolConfig(war_barrier=WarBarrier.AFTER_REPLAY_PREPARE, mode=Mode.NON_SPEC)
    _, races = timeline(proto)
    assert races == []
    dev = SimDevice(removed=("war_barrier",))
    run_protocol(dev, (proto, RECYCLE, Timing()))
    assert {(r.kind, r.buffer) for r in dev.finish().races} == {(RaceKind.WAR, "req_to_token")}


def test_every_war_barrier_choice_has_a_placement_class() -> None:
    assert set(PLACEMENTS) == set(WarBarrier)
    assert PLACEMENTS[WarBarrier.AFTER_REPLAY_PREPARE] is AfterReplayPrepare


@pytest.mark.parametrize(("platform", "forced", "want"), [
    (Platform.CUDA, False, LoopTop),
    (Platform.HIP, False, BarrierPlacement),
    (Platform.HIP, True, LoopTop),
])
def test_placement_for_platform(platform, forced, want) -> None:
    proto = ProtocolConfig(platform=platform, force_barrier=forced)
    assert type(placement_for(proto)) is want


EVENTS = (WorkloadEvent(2, EventKind.SKIP_PUBLISH, "A"),)


@pytest.mark.parametrize(("over", "events", "parts"), [
    ({}, (), ()),
    ({"stash_stream": StashStream.SIDE}, (), (SideStreamStash,)),
    ({}, EVENTS, (RowFaults,)),
    ({"mode": Mode.NON_SPEC, "delayed_sampling": True, "delayed_stash_after_gather": True},
     (), (StashAfterNextGather,)),
    ({"stash_stream": StashStream.SIDE}, EVENTS, (SideStreamStash, RowFaults)),
    ({"future_layout": FutureLayout.RING}, (), (RingFutureMap,)),
    ({"future_layout": FutureLayout.RING}, EVENTS, (RowFaults, RingFutureMap)),
], ids=["plain", "side", "rows", "deferred", "side+rows", "ring", "ring+rows"])
def test_future_map_for_composes_the_layout_and_injected_faults(over, events, parts) -> None:
    ctx = RunContext(SimDevice(), dc.replace(ProtocolConfig(), **over), Timing())
    fmap = future_map_for(ctx, dc.replace(STEADY, events=events))
    if not parts:
        assert type(fmap) is FutureMap
    for part in parts:
        assert isinstance(fmap, part)
    others = {SideStreamStash, RowFaults, StashAfterNextGather, RingFutureMap} - set(parts)
    assert not any(isinstance(fmap, cls) for cls in others)
