"""Mixed batches (non-spec, PROTOCOL.md §9.16, #34076) and late-found finishes (§7).

A mixed chunk's ``mix_running_indices`` is built on S and read by F's gather; without its
keep-alive the host drops it when run_batch returns and the next S allocation of that size (a
later prefill's ``future_indices``) reuses the block under the pending gather. Without a WAR
barrier (HIP, or none) nothing else orders that S write after the gather."""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    Mode,
    Platform,
    ProtocolConfig,
    Request,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.trace import RaceKind
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import run_with_oracle

R = Request
KEEP = "mix_running_indices.keep_alive"
NOSYNC = ProtocolConfig(mode=Mode.NON_SPEC, war_barrier=WarBarrier.NONE, debug_poison=True)
MIXED = Workload(
    iterations=7,
    requests=(R("A", 0, 10, 40), R("B", 0, 6, 40), R("X", 3, 5, 40), R("C", 4, 5, 40),
              R("D", 4, 7, 40)),
    events=(WorkloadEvent(3, EK.MIXED_CHUNK, "X"),),
)


def run(proto: ProtocolConfig, wl: Workload, removed: tuple[str, ...] = (), delays=None):
    """Overlapped run and its serial oracle: (outcome, races, diffs)."""
    p = run_with_oracle(proto, wl, removed, delays)
    return p.outcome, p.races, p.diffs


def reuse_of_mix(races):
    return [r for r in races if r.kind == RaceKind.REUSE and r.buffer == "mix_running_indices"]


@pytest.mark.parametrize("proto", [NOSYNC, dc.replace(NOSYNC, war_barrier=WarBarrier.LOOP_TOP,
                                                       platform=Platform.HIP)],
                         ids=["no_barrier", "hip"])
def test_mix_indices_without_keep_alive_are_reused_under_the_gather(proto) -> None:
    out, races, _ = run(proto, MIXED, (KEEP,))
    assert out.batch_kinds[3] == "mixed" and out.batches[3] == ["X", "A", "B"]
    hits = reuse_of_mix(races)
    assert hits, sorted({(str(r.kind), r.buffer) for r in races})
    assert {(r.first.op_name, r.first.agent, r.first.iteration) for r in hits} == {
        ("gather_output_tokens", "forward", 3)}
    assert {(r.second.agent, r.second.iteration) for r in hits} == {("schedule", 4)}
    good, twin, diffs = run(proto, MIXED)
    assert twin == [] and diffs == [] and good.debug_failures == []
    assert all(len(good.requests[r].tokens) > 0 for r in "ABXCD")


def test_delayed_gather_makes_the_reuse_manifest() -> None:
    delays = {("gather_output_tokens", 3): 3000.0}
    out, races, diffs = run(NOSYNC, MIXED, (KEEP,), delays)
    assert any(r.manifest for r in reuse_of_mix(races))
    assert diffs and out.failures("poison_assert")  # the gather read C's/D's fresh rows
    _, twin, twin_diffs = run(NOSYNC, MIXED, (), delays)
    assert twin == [] and twin_diffs == []


def test_loop_top_barrier_orders_the_reuse_after_the_gather() -> None:
    """At REF (CUDA, loop-top barrier) S waits for all of forward n before reallocating."""
    out, races, diffs = run(dc.replace(NOSYNC, war_barrier=WarBarrier.LOOP_TOP), MIXED, (KEEP,))
    assert out.batch_kinds[3] == "mixed" and races == [] and diffs == []


def test_mixed_chunk_needs_non_spec() -> None:
    with pytest.raises(HarnessError, match="mixed_chunk"):
        run_protocol(SimDevice(), (dc.replace(NOSYNC, mode=Mode.SPEC_V2), MIXED, Timing()))


# -- finish_late (§7) ------------------------------------------------------------------------

SPEC = ProtocolConfig(debug_poison=True)  # REF
LATE = Workload(iterations=7, requests=(R("A", 0, 10, 40), R("B", 0, 6, 40), R("C", 4, 5, 40)),
                events=(WorkloadEvent(3, EK.FINISH_LATE, "A"),))


def test_finish_late_is_skipped_and_race_free_at_ref() -> None:
    """Processing batch 2 at iteration 3 finds A finished; batch 3 still holds A and its
    result is skipped; C gets A's row at 4, behind the loop-top barrier."""
    out, races, diffs = run(SPEC, LATE)
    assert races == [] and diffs == [] and out.debug_failures == []
    a = out.requests["A"]
    assert a.finished_at == 2 and a.skipped_at == [3]
    assert "A" in out.batches[3] and "A" not in out.batches[4] and "C" in out.batches[4]
    twin, twin_races, _ = run(SPEC, dc.replace(LATE, events=()))
    assert twin_races == [] and twin.requests["A"].skipped_at == []
    assert len(twin.requests["A"].tokens) > len(a.tokens)


def test_finish_late_with_swa_races_at_ref_31687() -> None:
    """With SWA the late finish's release clears mapping entries forward 3 still reads."""
    _, races, _ = run(dc.replace(SPEC, swa=True), LATE)
    war = [r for r in races if r.kind == RaceKind.WAR and r.buffer == "full_to_swa_index_mapping"]
    assert war and {(r.second.op_name, r.second.iteration) for r in war} == {("release_kv", 3)}
    _, fixed, _ = run(dc.replace(SPEC, swa=True, war_barrier=WarBarrier.AFTER_LAUNCH), LATE)
    assert fixed == []
