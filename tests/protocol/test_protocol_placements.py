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
STEADY_PAIR = Workload(iterations=4, requests=(R("A", 0, 3, 40), R("B", 0, 3, 40)))


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
    # SGLang 0.5.23: verify's event is recorded, then EAGLE's draft-extend runner clears it,
    # so spec-v2 waits on all of F
    (WarBarrier.AFTER_LAUNCH_READ_DONE, Mode.SPEC_V2, [WAIT_EVENT[1], *WAIT_ALL],
     "record:publish_ready"),
    (WarBarrier.AFTER_LAUNCH_READ_DONE, Mode.NON_SPEC, WAIT_EVENT[::-1], "decode_forward"),
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


def test_after_launch_read_done_follows_the_launch_and_prefill_waits_on_all() -> None:
    """0.5.23's ``_apply_war_barrier`` runs right after the launch; a prefill (an extend
    forward) publishes no read-done event, so S waits on all of F there."""
    ops, races = timeline(ProtocolConfig(war_barrier=WarBarrier.AFTER_LAUNCH_READ_DONE,
                                         mode=Mode.NON_SPEC))
    assert races == []
    assert barrier_ops(ops, 0) == WAIT_ALL
    assert op_before(ops, 0, "forward", "record:forward->schedule") == "record:copy_done"
    # after the launch: the schedule stream's last op before the wait is the forward entry's
    assert op_before(ops, 2, "schedule", "wait:read_done") == "record:schedule->forward"


def test_after_launch_read_done_leaves_the_stash_index_to_the_pin_ring() -> None:
    """Publish and stash read ``future_indices`` after the decode's read-done event, so
    without the pin ring the next schedule step reuses its block (SGLang's non-spec gather
    has no record_stream); the coarse loop-top barrier orders that reuse."""
    proto = ProtocolConfig(war_barrier=WarBarrier.AFTER_LAUNCH_READ_DONE, mode=Mode.NON_SPEC)
    dev = SimDevice(removed=("batch_pin_ring",))
    run_protocol(dev, (proto, STEADY_PAIR, Timing()))
    assert (RaceKind.REUSE, "future_indices") in {(r.kind, r.buffer) for r in dev.finish().races}
    twin = SimDevice(removed=("batch_pin_ring",))
    run_protocol(twin, (dc.replace(proto, war_barrier=WarBarrier.LOOP_TOP), STEADY_PAIR, Timing()))
    assert twin.finish().races == []


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
