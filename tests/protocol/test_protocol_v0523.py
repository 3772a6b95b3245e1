"""The SGLang 0.5.23 mechanisms of model/protocol/relay_v0523.py and future_map.py: each
race-free as SGLang orders it, each racy with its one sync removed, with the accesses that
race named; the confidence relay under both answers of its copy_done query; the consume-once
assert firing only when a publish goes missing; keys refused where SGLang never goes."""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import (
    Platform,
    ProtocolConfig,
    Request,
    SeqLensD2H,
    Timing,
    Workload,
)
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.protocol.future_map import FutureMap
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import run_with_oracle

REF = ProtocolConfig(debug_poison=True)
STEADY = Workload(iterations=6, requests=(Request("A", 0, 10, 40), Request("B", 0, 6, 40)))
HIP_OPT_OUT = dc.replace(REF, platform=Platform.HIP, seq_lens_d2h=SeqLensD2H.NONE)


def race_pairs(proto: ProtocolConfig, removed: tuple[str, ...] = ()) -> set[tuple]:
    """(kind, buffer, first op, second op) of every race, checked against the oracle."""
    paired = run_with_oracle(proto, STEADY, removed)
    return {(str(r.kind), r.buffer, r.first.op_name, r.second.op_name) for r in paired.races}


@pytest.mark.parametrize("proto, label, race", [
    (dc.replace(REF, confidence_relay=True), "confidence.d2h_wait",
     ("RAW", "confidence_buf", "publish_confidence", "d2h_confidence_ring")),
    (dc.replace(REF, mixed_spec_tails=True, seq_lens_d2h=SeqLensD2H.NONE, debug_poison=False),
     "mixed_tails.d2h_wait", ("RAW", "new_seq_lens_buf", "publish", "d2h_mixed_tail_lens")),
    (dc.replace(HIP_OPT_OUT, stream_ordered_resolve=True), "resolve.stream_order",
     ("RAW", "new_seq_lens_buf", "publish", "gather_seq_lens")),
    (dc.replace(REF, adopted_relay=True, war_barrier="none"), "publish_ready.schedule_wait",
     ("RAW", "new_seq_lens_buf", "verify_graph_relay_scatter", "gather_seq_lens")),
])
def test_each_mechanism_is_clean_and_its_sync_is_needed(proto, label, race) -> None:
    """The fixed twin has no race; with ``label`` removed the named accesses race."""
    assert race_pairs(proto) == set()
    assert race in race_pairs(proto, (label,))


def test_redundant_waits_stay_race_free() -> None:
    """F's own publish_ready wait in the tails (CUDA) and the host synchronize (HIP) order
    nothing F's FIFO does not already order: removed, still race-free."""
    tails = dc.replace(REF, mixed_spec_tails=True, seq_lens_d2h=SeqLensD2H.NONE,
                       debug_poison=False)
    assert race_pairs(tails, ("mixed_tails.forward_wait",)) == set()
    hip = dc.replace(REF, platform=Platform.HIP, seq_lens_d2h=SeqLensD2H.SCHEDULE_STREAM,
                     mixed_spec_tails=True)
    assert race_pairs(hip, ("mixed_tails.host_wait",)) == set()
    assert ("RAW", "new_seq_lens_buf", "publish", "gather_seq_lens") in race_pairs(
        hip, ("publish_ready.host_wait",))


def test_tails_with_ci_poison_race_the_resolve_invalidate() -> None:
    """The model's finding (not checked against SGLang): with the CI poison, S's
    invalidate of the resolved rows races D's whole-buffer copy of the tails."""
    tails = dc.replace(REF, mixed_spec_tails=True, seq_lens_d2h=SeqLensD2H.NONE)
    assert ("RAW", "new_seq_lens_buf", "repoison_seq_lens", "d2h_mixed_tail_lens") in (
        race_pairs(tails))


def query_sites(proto: ProtocolConfig, outcomes: dict | None = None):
    """One run's races, query sites and op names."""
    dev = SimDevice(query_outcomes=outcomes)
    run_protocol(dev, (proto, STEADY, Timing()))
    run = dev.finish()
    return run.races, run.query_sites, {rec.name for rec in run.timeline}


def test_confidence_relay_is_race_free_under_both_query_answers() -> None:
    """copy_done.query() answers False by default (the planner skips the ring); forced True,
    the planner reads its slot, ordered after that slot's copy: no race either way."""
    proto = dc.replace(REF, confidence_relay=True)
    races, sites, ops = query_sites(proto)
    assert races == [] and "read_confidence_ring" not in ops
    assert {s.event for s in sites} == {"conf_copy_done_0", "conf_copy_done_1",
                                        "conf_copy_done_2"}
    # the prefill's publish (iteration 0) carries no confidence (DSpark's on_publish has
    # none there: no scatter, no ring copy), so the decodes of iterations 1 and 2 put
    # ring_pos at the lag of 2 by iteration 3
    assert min(s.iteration for s in sites) == 3
    races, _, ops = query_sites(proto, {s.key: True for s in sites})
    assert races == [] and "read_confidence_ring" in ops


def test_consume_once_fires_only_when_a_publish_goes_missing(monkeypatch) -> None:
    """A publish dropped at iteration 2 leaves the next resolve without a fresh publish."""
    proto = dc.replace(REF, consume_once=True)
    clean = run_with_oracle(proto, STEADY)
    assert clean.outcome.debug_failures == [] and clean.races == []
    publish = FutureMap.publish

    def drop_at_2(self, batch, new_seq_lens, stream=None):
        if batch.iteration != 2:
            publish(self, batch, new_seq_lens, stream)

    monkeypatch.setattr(FutureMap, "publish", drop_at_2)
    dev = SimDevice()
    out = run_protocol(dev, (proto, STEADY, Timing()))
    assert [(f.iteration, f.check) for f in out.debug_failures
            if f.check == "publish_not_fresh"] == [(3, "publish_not_fresh")]
    off = SimDevice()
    out = run_protocol(off, (dc.replace(proto, consume_once=False), STEADY, Timing()))
    assert all(f.check != "publish_not_fresh" for f in out.debug_failures)


@pytest.mark.parametrize("proto, key", [
    (dc.replace(REF, stream_ordered_resolve=True), "stream_ordered_resolve"),
    (dc.replace(REF, platform=Platform.HIP, seq_lens_d2h=SeqLensD2H.SCHEDULE_STREAM,
                confidence_relay=True), "confidence_relay"),
    (dc.replace(REF, mode="non_spec", consume_once=True), "consume_once"),
])
def test_keys_refused_where_sglang_never_goes(proto, key) -> None:
    with pytest.raises(HarnessError, match=f"protocol.{key} needs") as err:
        run_protocol(SimDevice(), (proto, STEADY, Timing()))
    assert "\n" not in str(err.value)
