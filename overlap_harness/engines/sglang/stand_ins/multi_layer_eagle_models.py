"""Stand-ins for what SGLang's multi-layer EAGLE worker runs that needs weights or Triton.

* :class:`FakeStepRunner`: one draft step's model runner (an MTP draft layer), where SGLang's
  ``ModelRunner`` of ``model_runner_list[step]`` stands. Its ``forward`` is the fake draft
  forward of :mod:`.eagle_models` (one declared op: reads input ids, positions, the carried
  hidden states, ``req_to_token[row, :seq_len]`` and the draft KV named, the page table its
  backend planned; writes the draft KV of ``out_cache_loc``, logits and hidden states),
  preceded by its backend's metadata planning when the batch is not marked planned, as
  SGLang's eager runner plans (``needs_forward_metadata_init``), and followed, in a draft
  extend that selects rows (``spec_info.select_index``), by the logits processor's gather of
  the selected rows' logits. Each step's KV is its own buffer (each draft layer has its own
  KV).
* ``rotate_input_ids`` (``multi_layer_eagle.py``'s Triton kernel, declared where the worker
  looks it up): each request's extend window of ``input_ids`` shifted left by one and the
  step's top-1 token written at its last place (or at ``select_index``); reads and writes
  ``input_ids``, reads the window starts and lengths, the top-k tokens and ``select_index``.
"""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins.eagle_models import (
    FakeDraftRunner,
    device_tensor,
    peek,
)
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

WORKER_MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"


class FakeStepRunner(FakeDraftRunner):
    """Draft step ``step``'s runner of the multi-layer worker (set by
    :mod:`..features.multi_layer_eagle`)."""

    def __init__(self, step: int, req_to_token_pool: Any, kv_tokens: int,
                 **fields: Any) -> None:
        super().__init__(req_to_token_pool, kv_tokens, **fields)
        self.step = step

    def planned_metadata(self, forward_batch: Any) -> torch.Tensor | None:
        """Every forward of a step runner is an extend (prefill or draft extend): the page
        table its own backend planned."""
        return self.attn_backend.forward_metadata

    def forward(self, forward_batch: Any, **kwargs: Any) -> Any:
        """The step's forward, its metadata planned first unless the batch is marked
        planned (SGLang's eager runner: ``needs_forward_metadata_init``)."""
        if forward_batch.needs_forward_metadata_init():
            self.attn_backend.init_forward_metadata(forward_batch)
        output = super().forward(forward_batch, **kwargs)
        select = getattr(forward_batch.spec_info, "select_index", None)
        if forward_batch.forward_mode.is_draft_extend_v2() and select is not None:
            # SGLang's logits processor keeps the selected rows' logits (each request's
            # last accepted token): a gather on the forward stream; FULL hidden states stay
            logits = output.logits_output
            logits.next_token_logits = logits.next_token_logits[select]
        return output


def rotated(input_ids: torch.Tensor, extend_start_loc: torch.Tensor,
             extend_seq_lens: torch.Tensor, topk_index: torch.Tensor,
             select_index: torch.Tensor | None = None) -> torch.Tensor:
    """``rotate_input_ids``' values: each window shifted left by one, the request's top-1
    token at its last place (``select_index[i]`` when given)."""
    values = peek(input_ids)
    starts, lengths = peek(extend_start_loc), peek(extend_seq_lens)
    tokens = [row[0] if isinstance(row, list) else row for row in peek(topk_index)]
    chosen = peek(select_index) if select_index is not None else None
    for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        if length <= 0:
            continue
        values[start:start + length - 1] = values[start + 1:start + length]
        last = chosen[i] if chosen is not None else start + length - 1
        values[last] = tokens[i]
    input_ids.copy_(device_tensor(values, input_ids))
    return input_ids


def rotate_accesses(out: Any, input_ids: torch.Tensor, extend_start_loc: torch.Tensor,
                     extend_seq_lens: torch.Tensor, topk_index: torch.Tensor,
                     select_index: torch.Tensor | None = None) -> list[DeclaredAccess]:
    acc = reads(input_ids) + reads(extend_start_loc) + reads(extend_seq_lens)
    acc += reads(topk_index)
    if select_index is not None:
        acc += reads(select_index)
    return acc + writes(input_ids)


def declare() -> None:
    """Register the declarations (idempotent)."""
    recorder.declare_kernel(f"{WORKER_MODULE}:rotate_input_ids", rotate_accesses,
                            cpu_impl=rotated, name="rotate_input_ids_kernel")
