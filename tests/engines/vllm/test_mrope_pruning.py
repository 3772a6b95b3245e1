"""Found while reading vLLM 0.32.0 under the recorder: with multimodal pruning and M-RoPE,
``_gather_mm_embeddings`` (in ``_preprocess``) recomputes the positions into the pinned
``mrope_positions`` right after ``_prepare_inputs`` issued its non-blocking per-row copies of
that buffer, in the same step and inside the same input-prep fence, so the fence cannot order
them. What is claimed is only this: with the harness's fake recompute (every position moved in
every call, no host sync) the detector finds the host rewrite racing the pending copies, and
without pruning the same steps are race-free. With vLLM's own recompute (video_prune/evs.py)
positions change only in calls that read device tensors on the host (``.item()``), which waits
for the copies; a recompute shaped that way is race-free here too. Skipped without vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

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


def test_the_fake_unsynced_recompute_rewrites_the_positions_under_this_steps_copies():
    watcher = mrope_pruning_steps(pruning=True)  # the fake: moves every position, no sync
    rewrite = site(GPUModelRunner, "_calc_mrope_positions",
                   "self.mrope_positions.cpu[:, dst_start:dst_end] = req.mrope_positions[")
    seconds = {(str(r.kind), f"{Path(r.second.source).name}") for r in watcher.races}
    assert ("host-D2H", f"gpu_model_runner.py:{rewrite.line}") in seconds  # the prefill
    decode_write = site(MRotaryEmbedding, "get_next_input_positions_tensor",
                        "out[:, out_offset : out_offset + num_new_tokens] = values")
    assert ("host-D2H", f"mrope.py:{decode_write.line}") in seconds  # the decodes
    assert {r.first.iteration for r in watcher.races} == {r.second.iteration
                                                          for r in watcher.races}  # same step


class RecomputeAfterAHostRead:
    """Shaped as vLLM's recompute (video_prune/evs.py): with media left to place it reads a
    device tensor on the host (``.item()``, which waits for the stream) and moves the
    positions; with none it returns them unchanged. The delta is computed from the positions
    as evs.py does. Remembers, per call, whether the positions changed."""

    def __init__(self) -> None:
        self.changed: list[bool] = []

    def __call__(self, input_ids, multimodal_embeddings, mrope_positions,
                 num_computed_tokens):
        positions = mrope_positions.clone()
        if multimodal_embeddings:
            positions += 1 + int(multimodal_embeddings[0].sum().item() > 0)
        self.changed.append(not torch.equal(positions, mrope_positions))
        return multimodal_embeddings, positions, int(positions.max()) + 1 - len(input_ids)


def test_with_a_recompute_shaped_as_vllms_only_identical_rewrites_are_flagged():
    """The steps whose recompute changed the positions (after its host read) are race-free;
    the detector, which does not compare bytes, still flags the later steps' rewrites, whose
    bytes are those already there."""
    recompute = RecomputeAfterAHostRead()
    watcher = mrope_pruning_steps(pruning=True, recompute=recompute)
    assert watcher.unknown_ops == []
    changed_steps = {step for step, changed in enumerate(recompute.changed) if changed}
    assert changed_steps == {0} and len(recompute.changed) == 3  # the prefill's image
    assert {r.second.iteration for r in watcher.races}.isdisjoint(changed_steps)
