"""SGLang 0.5.23's plan streams (``plan_stream_joins``) and spec mixed batches
(``spec_mixed_batches``): each run is checked against the serial oracle, each racy removal has
its race-free twin, and the keys are refused where SGLang never takes the path."""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import EventKind as EK
from overlap_harness.model.config import (
    ProtocolConfig,
    Request,
    SeqLensD2H,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol import run_protocol
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import run_with_oracle

LOOP = ProtocolConfig(seq_lens_d2h=SeqLensD2H.NONE,
                      war_barrier=WarBarrier.AFTER_LAUNCH_READ_DONE, copy_stream=True,
                      async_d2h=True, result_queue_hold=True, pool_size=8, max_context=64)
JOINS = dc.replace(LOOP, plan_stream_joins=True)
STEADY = Workload(iterations=6, requests=(Request("A", 0, 5, 12), Request("B", 0, 6, 12)))
MIXED = Workload(iterations=8, requests=(Request("A", 0, 3, 20),
                                         Request("B", 2, 13, 3, chunks=4)),
                 events=tuple(WorkloadEvent(n, EK.MIXED_CHUNK, "B") for n in range(2, 6)))
SPEC_MIXED = dc.replace(JOINS, spec_mixed_batches=True)


def race_pairs(proto: ProtocolConfig, workload: Workload,
               removed: tuple[str, ...] = ()) -> set[tuple]:
    """(kind, buffer, first op, second op) of every race; a race-free run's values match
    the serial oracle's."""
    paired = run_with_oracle(proto, workload, removed)
    races = {(str(r.kind), r.buffer, r.first.op_name, r.second.op_name) for r in paired.races}
    if not races:
        assert paired.diffs == [] and paired.outcome.debug_failures == []
    return races


def test_plan_stream_joins_are_race_free_intact() -> None:
    for proto in (JOINS, dc.replace(JOINS, topk=4, num_draft_tokens=6)):
        assert race_pairs(proto, STEADY) == set()


@pytest.mark.parametrize("label, race", [
    ("plan.verify_forward_wait", ("RAW", "seq_lens", "gather_seq_lens", "verify_out_cache_loc")),
    ("plan.verify_join", ("RAW", "out_cache_loc", "verify_out_cache_loc", "verify")),
])
def test_a_tree_verify_needs_both_verify_joins_a_chain_neither(label, race) -> None:
    """With topk 4 the verify's plan stream builds the verify slots; with topk 1 the draft
    built them on F and the verify's plan stream launches nothing: its joins order nothing."""
    assert race in race_pairs(dc.replace(JOINS, topk=4, num_draft_tokens=6), STEADY, (label,))
    assert race_pairs(JOINS, STEADY, (label,)) == set()


@pytest.mark.parametrize("label, race", [
    ("plan.extend_forward_wait",
     ("RAW", "seq_lens", "gather_seq_lens", "draft_extend_lengths")),
    ("plan.extend_join", ("RAW", "draft_extend_lens", "draft_extend_lengths", "draft_extend")),
])
def test_the_draft_workers_plan_stream_needs_both_joins(label, race) -> None:
    """The draft worker's own plan stream waits on F only before the draft extend: the
    verify's wait on the other plan stream does not order it."""
    assert race in race_pairs(JOINS, STEADY, (label,))


GRAPH = dc.replace(JOINS, verify_graph_load=True)


def test_the_verify_graph_load_is_race_free_intact() -> None:
    for proto in (GRAPH, dc.replace(GRAPH, topk=4, num_draft_tokens=6)):
        assert race_pairs(proto, STEADY) == set()


@pytest.mark.parametrize("label, race", [
    ("plan.verify_forward_wait", ("RAW", "drafts", "draft", "verify_graph_load_batch")),
    ("plan.verify_join",
     ("RAW", "graph_static_drafts", "verify_graph_load_batch", "verify")),
])
def test_a_chain_verify_under_the_graph_needs_both_verify_joins(label, race) -> None:
    """The graph's load_batch on the plan stream reads the draft's output and writes the
    static buffers the replayed verify reads: with topk 1 the joins the eager chain verify
    does not need (test above) order it."""
    races = race_pairs(GRAPH, STEADY, (label,))
    assert any(r[0] == race[0] and r[2:] == race[2:] for r in races), races
    assert race_pairs(JOINS, STEADY, (label,)) == set()


def test_spec_mixed_batches_late_bind_the_tails() -> None:
    paired = run_with_oracle(SPEC_MIXED, MIXED, ())
    assert paired.races == [] and paired.diffs == [] and paired.outcome.debug_failures == []
    kinds = paired.outcome.batch_kinds
    assert [kinds[n] for n in range(2, 6)] == ["mixed"] * 4
    assert len(paired.outcome.requests["B"].tokens) == 3


def test_the_barrier_fallback_orders_the_filter_after_the_tails() -> None:
    """The next filter_batch reads the seq_lens the tails wrote on F; the fallback wait
    (scheduler.py 2023) is what orders it."""
    race = ("RAW", "seq_lens", "mixed_seq_lens", "filter_batch_seq_lens")
    assert race in race_pairs(SPEC_MIXED, MIXED, ("war_barrier.fallback_wait",))


def test_the_tails_d2h_wait_is_redundant_behind_the_blocking_tail_base() -> None:
    """mix_with_running's blocking copy makes the host wait for S, which waited on F after
    the previous launch: the tails' D2H copy is ordered without its publish_ready wait; with
    the barrier's fallback gone too, it races the previous publish."""
    assert race_pairs(SPEC_MIXED, MIXED, ("mixed_tails.d2h_wait",)) == set()
    race = ("RAW", "new_seq_lens_buf", "publish", "d2h_mixed_tail_lens")
    assert race in race_pairs(SPEC_MIXED, MIXED,
                              ("mixed_tails.d2h_wait", "war_barrier.fallback_wait"))


@pytest.mark.parametrize("proto, match", [
    (dc.replace(LOOP, mode="non_spec", plan_stream_joins=True), "plan_stream_joins needs"),
    (dc.replace(JOINS, plan_stream=True), "replaces plan_stream"),
    (dc.replace(LOOP, mode="non_spec", spec_mixed_batches=True), "spec_mixed_batches needs"),
    (dc.replace(SPEC_MIXED, mixed_spec_tails=True), "mixed batches only"),
    (dc.replace(LOOP, verify_graph_load=True), "verify_graph_load stages"),
])
def test_keys_refused_where_sglang_never_goes(proto, match) -> None:
    with pytest.raises(HarnessError, match=match) as err:
        run_protocol(SimDevice(), (proto, STEADY, Timing()))
    assert "\n" not in str(err.value)


def test_spec_mixed_chunk_without_the_key_is_refused() -> None:
    with pytest.raises(HarnessError, match="spec_mixed_batches = true"):
        run_protocol(SimDevice(), (JOINS, MIXED, Timing()))
