"""Model Runner V2's speculative decoding under async scheduling: ``AsyncOutput`` with the
rejection sampler's counts, ``DraftTokensHandler`` (the drafts copied out for the grammar
check) and the adaptive verification's two pinned confidence slots, vLLM's own classes.
Race-free as released; each of their syncs, removed from vLLM's source, gives races at
vLLM's lines (verdicts by the detector). Skipped without vLLM."""

from __future__ import annotations

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker.gpu.async_utils import AsyncOutput
from vllm.v1.worker.gpu.spec_decode.adaptive_verification import AdaptiveVerificationManager
from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler

from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.vllm.mrv2_spec_decode import NUM_REQS, mrv2_spec_decode
from tests.engines.vllm.race_pairs import pairs


def test_as_released_the_accepted_ids_and_drafts_come_back_race_free():
    watcher = mrv2_spec_decode(steps=3, num_spec_tokens=2)
    sampled, drafts, token_counts = watcher.outputs
    assert watcher.races == [] and watcher.unknown_ops == []
    assert len(sampled) == 3 and all(len(step) == NUM_REQS for step in sampled)
    assert all(1 <= len(ids) <= 3 for step in sampled for ids in step)  # accepted + bonus
    assert [len(d.draft_token_ids) for d in drafts] == [NUM_REQS] * 3
    assert all(len(ids) == 2 for d in drafts for ids in d.draft_token_ids)
    assert token_counts == [NUM_REQS * 3] * 3


def test_without_the_drafts_event_synchronize_the_engine_reads_them_too_early():
    fence = site(DraftTokensHandler, "get_draft_tokens", "self.copy_event.synchronize()")
    read = site(DraftTokensHandler, "get_draft_tokens", ".tolist()")
    with removed(fence):
        racy = pairs(mrv2_spec_decode())
    assert any(kind == "host-D2H" and second == f"utils.py:{read.line}"
               for kind, _first, second in racy)


def test_without_record_stream_the_next_forward_reuses_the_drafts_under_their_copy():
    with removed(site(DraftTokensHandler, "set_draft_tokens",
                      "draft_tokens.record_stream(self.copy_stream)")):
        racy = pairs(mrv2_spec_decode())
    assert racy and {kind for kind, _f, _s in racy} == {"reuse"}


@pytest.mark.parametrize("needle", ["self._copy_events[ready_idx].synchronize()",
                                    "self._copy_events[write_idx].record()"])
def test_the_confidence_slots_need_their_events(needle):
    with removed(site(AdaptiveVerificationManager, "record_confidences", needle)):
        racy = pairs(mrv2_spec_decode())
    budget_read = site(AdaptiveVerificationManager, "get_num_tokens",
                       "self._stale_confidences[self._stale_idx].np[slots]")
    assert any(kind == "host-D2H" and second == f"adaptive_verification.py:{budget_read.line}"
               for kind, _first, second in racy)


def test_without_the_output_copy_streams_wait_the_accepted_ids_are_copied_unsampled():
    with removed(site(AsyncOutput, "__init__", "copy_stream.wait_stream(main_stream)")):
        racy = pairs(mrv2_spec_decode())
    assert any(kind == "RAW" and second.startswith("async_utils.py:")
               for kind, _first, second in racy)
