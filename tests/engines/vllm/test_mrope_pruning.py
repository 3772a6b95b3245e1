"""Found while reading vLLM 0.32.0 under the recorder: with multimodal pruning and M-RoPE,
``_gather_mm_embeddings`` (in ``_preprocess``) recomputes the positions into the pinned
``mrope_positions`` right after ``_prepare_inputs`` issued its non-blocking per-row copies of
that buffer, in the same step and inside the same input-prep fence, so the fence cannot order
them. The detector finds the host rewrite racing the pending copies; without pruning the same
steps are race-free. (Whether the bytes differ depends on the model's recompute.) Skipped
without vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.model_executor.layers.rotary_embedding.mrope import MRotaryEmbedding
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from overlap_harness.engines.core.mutation import site
from overlap_harness.engines.vllm.fence_scope import mrope_pruning_steps


def test_without_pruning_the_positions_are_race_free():
    watcher = mrope_pruning_steps(pruning=False)
    assert watcher.races == [] and watcher.unknown_ops == []


def test_with_pruning_the_gather_rewrites_the_positions_under_this_steps_copies():
    watcher = mrope_pruning_steps(pruning=True)
    rewrite = site(GPUModelRunner, "_calc_mrope_positions",
                   "self.mrope_positions.cpu[:, dst_start:dst_end] = req.mrope_positions[")
    seconds = {(str(r.kind), f"{Path(r.second.source).name}") for r in watcher.races}
    assert ("host-D2H", f"gpu_model_runner.py:{rewrite.line}") in seconds  # the prefill
    decode_write = site(MRotaryEmbedding, "get_next_input_positions_tensor",
                        "out[:, out_offset : out_offset + num_new_tokens] = values")
    assert ("host-D2H", f"mrope.py:{decode_write.line}") in seconds  # the decodes
    assert {r.first.iteration for r in watcher.races} == {r.second.iteration
                                                          for r in watcher.races}  # same step
