"""The protocol model on SimDevice: REF is race-free and equals the serial oracle; each sync
removed (PROTOCOL.md §9) gives the race the detector is expected to compute, and its twin with
the sync restored is race-free. Assertions are on what the detector computed (kind, buffer)."""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    Gather,
    Mode,
    Platform,
    ProtocolConfig,
    Request,
    SeqLensSync,
    StashStream,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.protocol import compare_runs, run_protocol
from overlap_harness.model.trace import Race, RaceKind
from overlap_harness.sim.sim_device import SimDevice

BASE = ProtocolConfig(gather=Gather.UNFUSED)
R = Request
# no request finishes: no row is recycled, so only the removed sync can cause a race
STEADY = Workload(iterations=6, requests=(R("A", 0, 10, 40), R("B", 0, 6, 40)))
# A finishes after 2 tokens while still scheduled; C arrives and gets A's row (§9.8)
RECYCLE = Workload(iterations=8, requests=(R("A", 0, 10, 2), R("B", 0, 6, 40), R("C", 3, 5, 40)))
EVICT = Workload(iterations=7, requests=(R("A", 0, 10, 40), R("B", 0, 10, 40)),
                 events=(WorkloadEvent(4, EK.EVICT_SWA, "A"),))


def run(proto: ProtocolConfig, wl: Workload, removed: tuple[str, ...] = ()):
    """Overlapped run: (outcome, observations, races)."""
    dev = SimDevice(removed=removed)
    out = run_protocol(dev, (proto, wl, Timing()))
    return out, dev.observations, dev.finish().races


def oracle(proto: ProtocolConfig, wl: Workload):
    """Serial run: (outcome, observations); it must itself be race-free."""
    dev = SimDevice(serial=True)
    out = run_protocol(dev, (proto, wl, Timing()))
    assert dev.finish().races == []
    return out, dev.observations


def keys(races: list[Race]) -> set[tuple[str, str]]:
    return {(str(r.kind), r.buffer) for r in races}


def describe(races: list[Race]) -> str:
    return "\n".join(r.describe() for r in races[:5])


def test_ref_default_is_race_free_and_equals_oracle() -> None:
    proto = ProtocolConfig(debug_poison=True)  # REF: fused gather, loop-top barrier, D2H stream
    out, obs, races = run(proto, RECYCLE)
    assert races == [], describe(races)
    o_out, o_obs = oracle(proto, RECYCLE)
    assert compare_runs(out, obs, o_out, o_obs) == []
    assert out.debug_failures == []
    assert out.requests["A"].finished_at is not None and len(out.requests["A"].tokens) == 2
    assert all(len(r.tokens) > 0 for r in out.requests.values())


CASES = [
    # (id, protocol overrides, workload, removed label, expected race kind, buffer, reader agent)
    ("s2_schedule_wait", {"war_barrier": WarBarrier.NONE}, STEADY,
     "publish_ready.schedule_wait", RaceKind.RAW, "new_seq_lens_buf", "schedule"),
    ("s3_d2h_wait", {}, STEADY, "publish_ready.d2h_wait", RaceKind.RAW, "new_seq_lens_buf",
     "fwd_prepare_d2h"),
    ("s4_d2h_host_sync", {}, STEADY, "d2h.host_sync", RaceKind.HOST_D2H,
     "new_seq_lens_cpu_pinned", None),
    ("copy_done_host_sync", {}, STEADY, "copy_done.host_sync", RaceKind.HOST_D2H,
     "next_tokens_cpu", None),
    ("s10_forward_entry", {}, STEADY, "forward_entry", RaceKind.RAW, "req_to_token", "forward"),
    ("s8_recycled_row", {}, RECYCLE, "war_barrier", RaceKind.WAR, "req_to_token", "schedule"),
    ("s7_swa_evict", {"swa": True}, EVICT, "war_barrier", RaceKind.WAR,
     "full_to_swa_index_mapping", "schedule"),
    ("s9_after_launch", {"swa": True, "war_barrier": WarBarrier.AFTER_LAUNCH}, RECYCLE,
     "war_barrier", RaceKind.WAR, "full_to_swa_index_mapping", "schedule"),
    ("legacy_verify_done", {"seq_lens_sync": SeqLensSync.VERIFY_DONE,
                            "war_barrier": WarBarrier.NONE}, STEADY,
     "verify_done.schedule_wait", RaceKind.RAW, "new_seq_lens_buf", "schedule"),
    ("s23_hip_host_wait", {"platform": Platform.HIP}, STEADY, "publish_ready.host_wait",
     RaceKind.RAW, "new_seq_lens_buf", "schedule"),
    ("plan_stream", {"plan_stream": True}, STEADY, "plan.forward_wait", RaceKind.RAW,
     "plan_metadata", "forward"),
    ("delayed_sampling", {"mode": Mode.NON_SPEC, "delayed_sampling": True}, STEADY,
     "delayed_sampling.forward_wait", RaceKind.RAW, "grammar_mask", "forward"),
    ("nonspec_forward_entry", {"mode": Mode.NON_SPEC}, STEADY, "forward_entry", RaceKind.RAW,
     "req_to_token", "forward"),
]


@pytest.mark.parametrize(("over", "wl", "label", "kind", "buffer", "agent"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_removed_sync_races_and_twin_is_clean(over, wl, label, kind, buffer, agent) -> None:
    proto = dc.replace(BASE, **over)
    _, _, races = run(proto, wl, (label,))
    hits = [r for r in races if r.kind == kind and r.buffer == buffer]
    assert hits, f"expected {kind} {buffer}; detector found {sorted(keys(races))}"
    if agent is not None:
        assert any(r.second.agent == agent for r in hits), describe(hits)
    _, _, twin = run(proto, wl)
    assert twin == [], describe(twin)


def test_loop_top_barrier_misses_result_processing_war_31687() -> None:
    """REF's loop-top barrier: processing n-1 clears SWA entries forward n still reads."""
    proto = dc.replace(BASE, swa=True)
    _, _, races = run(proto, RECYCLE)
    war = [r for r in races if r.kind == RaceKind.WAR and r.buffer == "full_to_swa_index_mapping"]
    assert war and all(r.second.op_name == "release_kv" for r in war), describe(races)
    assert {r.first.op_name for r in war} == {"verify"}
    _, _, fixed = run(dc.replace(proto, war_barrier=WarBarrier.AFTER_LAUNCH), RECYCLE)
    assert fixed == [], describe(fixed)


def test_read_done_barrier_is_clean_on_recycled_rows() -> None:
    _, _, races = run(dc.replace(BASE, war_barrier=WarBarrier.READ_DONE), RECYCLE)
    assert races == [], describe(races)


def test_pin_ring_and_record_stream_guard_index_reuse() -> None:
    """§9.14/15 with no barrier: ring depth 0 frees snapshot tensors at once (reuse);
    dropping record_stream too exposes future_indices read by F's gather."""
    nb = dc.replace(BASE, war_barrier=WarBarrier.NONE)
    _, _, shallow = run(dc.replace(nb, pin_ring_depth=0), STEADY)
    assert any(r.kind == RaceKind.REUSE for r in shallow), sorted(keys(shallow))
    _, _, removed = run(nb, STEADY, ("batch_pin_ring",))
    assert any(r.kind == RaceKind.REUSE for r in removed)

    def fi_gather(races: list[Race]) -> list[Race]:  # F's reads of a decode batch's indices
        return [r for r in races if r.kind == RaceKind.REUSE and r.first.agent == "forward"
                and r.first.buffer == "future_indices" and r.first.iteration >= 1]

    _, _, both = run(dc.replace(nb, pin_ring_depth=0), STEADY, ("future_indices.record_stream",))
    assert fi_gather(both), sorted(keys(both))
    assert not fi_gather(shallow)
    _, _, twin = run(nb, STEADY, ("future_indices.record_stream",))
    assert twin == [], describe(twin)


@pytest.mark.parametrize("mode", [Mode.SPEC_V2, Mode.NON_SPEC])
def test_side_stream_stash_without_fifo_event_races_with_next_gather(mode) -> None:
    """§9.1: the stash on a side stream; F waits its stash_done before the next gather
    (stash.fifo). Removed, the gather reads the relay rows unordered with the stash."""
    proto = dc.replace(BASE, mode=mode, stash_stream=StashStream.SIDE, debug_poison=True)
    _, _, races = run(proto, STEADY, ("stash.fifo",))
    raw = [r for r in races if r.kind == RaceKind.RAW and r.buffer == "output_tokens_buf"]
    assert raw, sorted(keys(races))
    assert {(r.first.op_name, r.first.agent) for r in raw} == {("stash", "stash_side")}
    assert {r.second.agent for r in raw} == {"forward"}
    _, _, twin = run(proto, STEADY)
    assert twin == [], describe(twin)
    _, _, ref = run(dc.replace(proto, stash_stream=StashStream.FORWARD), STEADY, ("stash.fifo",))
    assert ref == []  # REF stashes on F: the label is never reached


def test_manifest_seq_lens_race_shows_in_values() -> None:
    """§9.3: D copies before publish lands: seq_lens_cpu differs from the oracle's."""
    out, obs, races = run(BASE, STEADY, ("publish_ready.d2h_wait",))
    assert any(r.manifest for r in races)
    o_out, o_obs = oracle(BASE, STEADY)
    diffs = compare_runs(out, obs, o_out, o_obs)
    assert any(d.key == "seq_lens_cpu" for d in diffs), diffs
    out2, obs2, _ = run(BASE, STEADY)
    assert compare_runs(out2, obs2, o_out, o_obs) == []


def test_the_verify_inputs_record_stream_keeps_their_blocks_from_reuse() -> None:
    """SGLang 0.5.23's record_stream of the verify's inputs (protocol.verify_record_stream):
    with the pin ring at depth 0 and no barrier, dropping the pre-preparation record
    (record_stream_for_v2_verify) lets the schedule stream reuse the lengths' block while F
    still reads it; with the record kept (the twin) that block is never reused early."""
    proto = dc.replace(BASE, mode=Mode.SPEC_V2, topk=4, num_draft_tokens=6,
                       plan_stream_joins=True, verify_record_stream=True,
                       war_barrier=WarBarrier.NONE, pin_ring_depth=0)

    def lengths_reused(races: list[Race]) -> list[Race]:
        return [r for r in races if r.kind == RaceKind.REUSE and r.buffer == "seq_lens"
                and r.first.agent == "forward" and r.second.agent == "schedule"]

    _, _, removed = run(proto, STEADY, ("verify_pre_prepare.record_stream",))
    assert lengths_reused(removed), sorted(keys(removed))
    _, _, twin = run(proto, STEADY)
    assert not lengths_reused(twin), describe(twin)
    _, _, unmarked = run(dc.replace(proto, verify_record_stream=False), STEADY)
    assert lengths_reused(unmarked), sorted(keys(unmarked))
