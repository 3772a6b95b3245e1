"""Relay logic bugs of PROTOCOL.md §9.17, §9.18 and §9.21: no race, so the debug checks of
#26108 (-1 poison of output_tokens_buf) and #30471 (-1 poison of new_seq_lens_buf) are what
catches them; without the poison the wrong value is read silently. Each case has its twin
without the event, which must be clean."""

from __future__ import annotations

import dataclasses as dc

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    Gather,
    Mode,
    ProtocolConfig,
    Request,
    Workload,
    WorkloadEvent,
)
from overlap_harness.sim.sim_device import GARBAGE
from tests.dsl import run_with_oracle

R = Request
SPEC = ProtocolConfig(gather=Gather.UNFUSED, debug_poison=True)
NONSPEC = dc.replace(SPEC, mode=Mode.NON_SPEC)
STEADY = Workload(iterations=7, requests=(R("A", 0, 10, 40), R("B", 0, 6, 40)))


def run_pair(proto: ProtocolConfig, wl: Workload):
    """Overlapped run and its serial oracle: (outcome, observations, races, diffs)."""
    p = run_with_oracle(proto, wl)
    return p.outcome, p.observations, p.races, p.diffs


def with_events(*events: WorkloadEvent, wl: Workload = STEADY) -> Workload:
    return dc.replace(wl, events=events)


def gathered(obs, n: int, pos: int) -> int:
    """Non-spec: the token the decode gather of iteration ``n`` read for batch row ``pos``."""
    return int(obs[("gather_output_tokens", n)][0][pos])


def checks(out) -> set[tuple[int, str, str]]:
    return {(f.iteration, f.request, f.check) for f in out.debug_failures}


# -- §9.17 WWRR (#26108) -------------------------------------------------------------------

def test_double_stash_poison_fires_on_the_second_gather() -> None:
    """Stash twice at 3 (the replay stands in for A's stash at 4): gather 4 reads the value
    and invalidates; gather 5 reads -1."""
    for proto in (SPEC, NONSPEC):
        out, _, races, diffs = run_pair(proto, with_events(WorkloadEvent(3, EK.DOUBLE_STASH, "A")))
        assert races == [] and diffs == []
        assert checks(out) == {(5, "A", "poison_assert")}, out.debug_failures


def test_double_stash_without_poison_reads_one_value_twice() -> None:
    proto = dc.replace(NONSPEC, debug_poison=False)
    out, obs, races, diffs = run_pair(proto, with_events(WorkloadEvent(3, EK.DOUBLE_STASH, "A")))
    assert races == [] and diffs == [] and out.debug_failures == []
    assert out.batches[4][0] == out.batches[5][0] == "A"
    assert gathered(obs, 5, 0) == gathered(obs, 4, 0)  # W W R R: the second read is stale
    _, good, _, _ = run_pair(proto, STEADY)
    assert gathered(good, 5, 0) != gathered(good, 4, 0)


def test_double_stash_twin_is_clean() -> None:
    for proto in (SPEC, NONSPEC):
        out, _, races, diffs = run_pair(proto, STEADY)
        assert races == [] and diffs == [] and out.debug_failures == []


# -- §9.18 gather before any stash -----------------------------------------------------------

def test_missing_seed_poison_fires_on_the_first_gather() -> None:
    for proto in (SPEC, NONSPEC):
        out, _, races, diffs = run_pair(proto, with_events(WorkloadEvent(0, EK.SKIP_SEED, "B")))
        assert races == [] and diffs == []
        assert checks(out) == {(1, "B", "poison_assert")}, out.debug_failures


def test_missing_seed_without_poison_reads_garbage() -> None:
    proto = dc.replace(NONSPEC, debug_poison=False)
    out, obs, races, _ = run_pair(proto, with_events(WorkloadEvent(0, EK.SKIP_SEED, "B")))
    assert races == [] and out.debug_failures == []
    assert out.batches[1] == ["A", "B"]
    assert gathered(obs, 1, 1) == GARBAGE  # torch.empty: never written
    assert gathered(obs, 1, 0) >= 0
    _, good, _, _ = run_pair(proto, STEADY)
    assert gathered(good, 1, 1) >= 0


# -- §9.21 merge a prefill into running, publish skipped (#30471 poison) --------------------

MERGE = Workload(iterations=6, requests=(R("A", 0, 10, 40), R("B", 0, 6, 40),
                                         R("C", 3, 5, 40), R("D", 3, 7, 40)))


def test_merged_prefill_without_publish_fires_seq_lens_poison() -> None:
    """Prefill [C, D] at 3 skips C's publish; the merged decode at 4 resolves C's row: -1."""
    out, _, races, diffs = run_pair(SPEC, with_events(WorkloadEvent(3, EK.SKIP_PUBLISH, "C"),
                                                      wl=MERGE))
    assert out.batches[4] == ["A", "B", "C", "D"]
    assert races == [] and diffs == []
    assert {(f.iteration, f.request) for f in out.failures("seq_lens_poison")} == {(4, "C")}
    assert out.requests["C"].seq_lens_cpu[4] == -1


def test_merged_prefill_without_publish_and_poison_reads_garbage() -> None:
    proto = dc.replace(SPEC, debug_poison=False)
    out, _, races, _ = run_pair(proto, with_events(WorkloadEvent(3, EK.SKIP_PUBLISH, "C"),
                                                   wl=MERGE))
    assert races == [] and out.debug_failures == []
    assert out.requests["C"].seq_lens_cpu[4] == GARBAGE
    assert out.requests["D"].seq_lens_cpu[4] == 7


def test_merged_prefill_twin_is_clean() -> None:
    out, _, races, diffs = run_pair(SPEC, MERGE)
    assert races == [] and diffs == [] and out.debug_failures == []
    assert out.requests["C"].seq_lens_cpu[4] == 5
