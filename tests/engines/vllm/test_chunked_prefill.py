"""Chunked prefill through vLLM's engine core on the V1 runner's async path: a long prompt
scheduled in chunks by the real ``AsyncScheduler`` beside decoding requests, two batches in
flight, the inputs staged under ``synchronize_input_prep()`` and the samples read back
through ``AsyncGPUModelRunnerOutput``. Race-free as released; each of those syncs, removed
from vLLM's source, gives races (verdicts by the detector). Skipped without vLLM."""

from __future__ import annotations

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput, GPUModelRunner

from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.vllm.chunked_prefill import (
    LONG_PROMPT,
    TOKEN_BUDGET,
    chunked_prefill_steps,
)
from tests.engines.vllm.race_pairs import pairs


def test_the_long_prompt_is_chunked_beside_decodes_and_every_request_finishes_race_free():
    watcher = chunked_prefill_steps(max_tokens=4)
    assert watcher.finished == {"req0", "req1", "req2"}
    prefill, decodes = [], list(watcher.chunks)
    while sum(prefill) < len(LONG_PROMPT):
        prefill.append(decodes.pop(0))
    assert sum(prefill) == len(LONG_PROMPT) and len(prefill) >= 3
    assert max(prefill) < TOKEN_BUDGET  # shared with the decoding requests
    assert decodes == [1, 1, 1]  # the last chunk samples the first token
    assert watcher.races == [] and watcher.unknown_ops == []


@pytest.mark.parametrize("needle", ["self.prepare_inputs_event.synchronize()",
                                    "self.prepare_inputs_event.record()"])
def test_without_the_input_prep_fence_the_next_chunk_rewrites_staging_under_its_copy(needle):
    with removed(site(GPUModelRunner, "synchronize_input_prep", needle)):
        racy = pairs(chunked_prefill_steps())
    copy = site(CpuGpuBuffer, "copy_to_gpu", "non_blocking=True")
    assert racy and {(kind, first) for kind, first, _second in racy} == {
        ("host-D2H", f"utils.py:{copy.line}")}


def test_without_get_outputs_synchronize_the_engine_reads_the_samples_too_early():
    with removed(site(AsyncGPUModelRunnerOutput, "get_output",
                      "self.async_copy_ready_event.synchronize()")):
        racy = pairs(chunked_prefill_steps())
    copy = site(AsyncGPUModelRunnerOutput, "__init__", "self._sampled_token_ids.to(")
    read = site(AsyncGPUModelRunnerOutput, "get_output", "self.sampled_token_ids_cpu.tolist()")
    assert ("host-D2H", f"gpu_model_runner.py:{copy.line}",
            f"gpu_model_runner.py:{read.line}") in racy
