"""SGLang 0.5.23's own FutureMap under the recorder: unmodified race-free, each mutation caught.

Skipped with the reason when the sglang extra is not installed (docs/sglang-conformance.md).
The verdicts are computed by the driver on every run, never written in.
"""

from __future__ import annotations

import pytest

from overlap_harness.conformance.sglang_env import unavailable_reason

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    from overlap_harness.conformance.driver import VARIANTS, Mutation, run_variant
else:  # the names the parametrisation needs, without importing sglang
    VARIANTS, Mutation, run_variant = {}, None, None


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unmodified_futuremap_is_race_free(variant):
    assert run_variant(variant).races == []


CAUGHT = [  # (variant, mutation, race kind, buffer the race is on)
    ("non_spec_decode", "forward_no_wait_schedule", "RAW", "req_to_token"),
    ("eagle_spec_v2", "forward_no_wait_schedule", "WAR", "new_seq_lens_buf"),
    ("retracted_request", "war_barrier_removed", "WAR", "req_to_token"),
    ("eagle_d2h_stream", "publish_ready_wait_dropped", "RAW", "new_seq_lens_buf"),
    ("eagle_d2h_stream", "pinned_mirror_read_early", "host-D2H", "new_seq_lens_cpu_pinned"),
    ("non_spec_decode", "relay_index_freed_without_record_stream", "reuse", "req_pool_indices"),
    # the ring alone: SGLang's non-spec decode has no record_stream on req_pool_indices
    ("non_spec_decode", "keep_alive_ring_dropped", "reuse", "req_pool_indices"),
]


def buffer_of(race) -> str:
    """``new_seq_lens_buf`` from the recorder's ``self.new_seq_lens_buf@overlap_utils.py:320``."""
    return race.buffer.split("@", 1)[0].removeprefix("self.")


@pytest.mark.parametrize(("variant", "mutation", "kind", "buffer"), CAUGHT)
def test_mutation_is_caught_at_sglang_lines(variant, mutation, kind, buffer):
    races = run_variant(variant, Mutation(mutation)).races
    assert races, f"{mutation} on {variant}: no race"
    assert (kind, buffer) in {(str(r.kind), buffer_of(r)) for r in races}
    sites = {race.first.source for race in races} | {race.second.source for race in races}
    # the recycled row's race is between the loop's own forward and schedule steps
    in_sglang = mutation != "war_barrier_removed"
    assert any("sglang/srt/managers/overlap_utils.py:" in site for site in sites) == in_sglang


def test_record_stream_dropped_alone_is_held_by_the_ring():
    """The fixed twin of the ring-only drop: SGLang's own record_stream calls skipped (the
    mixed batch's ``mix_running_indices``), the keep-alive ring kept: race-free."""
    outcome = run_variant("chunked_prefill", Mutation("record_stream_dropped"))
    assert outcome.dropped > 0
    assert outcome.races == []


def test_unmodified_spec_run_declares_the_triton_gather():
    """SGLang's Triton gather_spec_extras runs (interpreted) as one declared op: no op of
    unknown accesses is left, so a race through it could not go unseen."""
    outcome = run_variant("eagle_spec_v2")
    assert outcome.unknown_ops == []
    assert outcome.races == []


def test_publish_ready_race_pairs_the_publish_with_the_copy_back():
    """The expected RAW: the forward stream's publish scatter, then the D2H stream's copy."""
    races = [r for r in run_variant("eagle_d2h_stream", Mutation("publish_ready_wait_dropped"))
             .races if str(r.kind) == "RAW" and buffer_of(r) == "new_seq_lens_buf"]
    agents = {(r.first.agent.removeprefix("self."), r.second.agent.removeprefix("self."))
              for r in races}
    assert ("forward_stream", "fwd_prepare_d2h_stream") in agents
