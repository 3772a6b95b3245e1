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


CAUGHT = [
    ("non_spec_decode", "forward_no_wait_schedule", "RAW req_to_token"),
    ("eagle_spec_v2", "forward_no_wait_schedule", "WAR new_seq_lens"),
    ("retracted_request", "war_barrier_removed", "WAR req_to_token"),
    ("eagle_d2h_stream", "publish_ready_wait_dropped", "RAW new_seq_lens"),
    ("eagle_d2h_stream", "pinned_mirror_read_early", "RAW new_seq_lens_cpu_pinned"),
    ("non_spec_decode", "relay_index_freed_without_record_stream", None),
]


@pytest.mark.parametrize(("variant", "mutation", "key"), CAUGHT)
def test_mutation_is_caught_at_sglang_lines(variant, mutation, key):
    races = run_variant(variant, Mutation(mutation)).races
    keys = {race.key for race in races}
    assert races, f"{mutation} on {variant}: no race"
    if key is not None:
        assert key in keys
    if mutation in ("publish_ready_wait_dropped", "pinned_mirror_read_early"):
        sites = {race.first.source for race in races} | {race.second.source for race in races}
        assert any(site.startswith("sglang/srt/managers/overlap_utils.py:") for site in sites)


def test_publish_ready_race_pairs_the_publish_with_the_copy_back():
    """The expected RAW: the forward stream's publish scatter, then the D2H stream's copy."""
    races = [r for r in run_variant("eagle_d2h_stream", Mutation("publish_ready_wait_dropped"))
             .races if r.key == "RAW new_seq_lens"]
    agents = {(r.first.agent, r.second.agent) for r in races}
    assert ("forward_stream", "fwd_prepare_d2h_stream") in agents
