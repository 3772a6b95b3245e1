"""The eager prefill path's stand-ins for SGLang's attention backend and model body.

* :func:`pre_replay_backend_class`: a subclass of SGLang's ``AttentionBackend`` (its
  ``resolve_prefill_shared_read_ends`` and snapshot hooks are SGLang's) that declares
  ``SharedReadEnds.PRE_REPLAY`` for EXTEND, as TRT-LLM MHA does (trtllm_mha_backend.py:
  "Prefill metadata init snapshots all scheduler-shared inputs pre-replay"), and keeps that
  promise: its ``init_forward_metadata`` is one declared op that reads, per row,
  ``req_to_token[row, :seq_len]`` and writes the backend's private KV-index copy; nothing
  after it reads the scheduler-shared rows;
* :class:`EagerModel`: the model body, one declared op reading the runner's static inputs,
  the private KV indices and the KV slots they name, writing the new KV slots and a fresh
  logits tensor.

This file is plumbing to the recorder (``not_user_code``): an op declared here is reported at
the SGLang line that called it (the eager runner's ``init_forward_metadata`` or
``model.forward`` call), as a kernel launch would be.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    _kernel_values,
    _static_rows,
    copy_row_kv_indices,
)
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names SGLang's line that called the stand-in

VOCAB = 1000


def _metadata_accesses(result: Any, backend: Any, forward_batch: Any) -> list[DeclaredAccess]:
    req_to_token = backend.req_to_token
    out = reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    for row, seq_len in _static_rows(forward_batch.req_pool_indices, forward_batch.seq_lens):
        out += reads(req_to_token[row, :seq_len])
    return out + writes(backend.kv_indices) + writes(backend.kv_indptr)


@declared(_metadata_accesses, name="attn_metadata_prep (eager)")
def _metadata_prep(backend: Any, forward_batch: Any) -> None:
    """The backend's private copy of each row's KV indices, on the current (forward) stream:
    after it, no kernel of this forward reads the scheduler-shared ``req_to_token``."""
    with _kernel_values():
        copy_row_kv_indices(backend, forward_batch.req_pool_indices, forward_batch.seq_lens)


def _forward_accesses(result: Any, runner: Any, forward_batch: Any
                      ) -> list[DeclaredAccess]:
    backend = runner.attn_backend
    bs = forward_batch.batch_size
    used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    return out + writes(result)


@declared(_forward_accesses, name="model_forward (eager)")
def _eager_model_forward(runner: Any, forward_batch: Any) -> torch.Tensor:
    """Values a model could produce, as the fake worker's forward makes them
    (stand_ins/model_worker.py): each new KV slot holds its input token + 1; each request's
    logits row is one-hot at the sum of the KV its private indices name plus its length (mod
    the vocabulary)."""
    backend = runner.attn_backend
    # allocated outside the kernel's value computation: a device tensor, as the model's is
    logits = torch.zeros((forward_batch.batch_size, VOCAB), dtype=torch.float32,
                         device=runner.kv_buffer.device)
    with _kernel_values():
        tokens = forward_batch.input_ids.to(torch.float32) + 1.0
        runner.kv_buffer.index_copy_(0, forward_batch.out_cache_loc.to(torch.int64),
                                     tokens.view(-1, 1).to(runner.kv_buffer.dtype))
        bs = forward_batch.batch_size
        starts = backend.kv_indptr[:bs].to(torch.int64)
        lengths = backend.kv_indptr[1:bs + 1].to(torch.int64) - starts
        width = backend.req_to_token.shape[1]
        column = torch.arange(width, device=starts.device)
        inside = column.unsqueeze(0) < lengths.unsqueeze(1)
        where = torch.where(inside, starts.unsqueeze(1) + column.unsqueeze(0),
                            torch.zeros_like(starts).unsqueeze(1))
        slots = backend.kv_indices.index_select(0, where.reshape(-1)).to(torch.int64)
        kv = runner.kv_buffer.index_select(0, slots).reshape(bs, width)
        sums = (kv * inside).sum(dim=1).to(torch.int64) + lengths
        logits.scatter_(1, torch.remainder(sums, VOCAB).unsqueeze(1), 1.0)
    return logits  # a fresh tensor: the recorder adopts it as the kernel's output


@functools.cache
def pre_replay_backend_class() -> type:
    """The stand-in backend: SGLang's ``AttentionBackend`` subclassed (its prefill read-end
    resolution is SGLang's), made when SGLang is loaded."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, SharedReadEnds
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    class PreReplayBackend(AttentionBackend):
        """Prefill shared reads end in ``init_forward_metadata`` (``PRE_REPLAY``)."""

        needs_cpu_seq_lens = False

        def __init__(self, req_to_token: torch.Tensor, max_bs: int) -> None:
            self.req_to_token = req_to_token
            width = req_to_token.shape[1]
            # one more element: the trash slot of entries past a row's length
            self.kv_indices = torch.zeros(max_bs * width + 1, dtype=torch.int32,
                                          device="cuda")
            self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device="cuda")
            self.metadata_preps = 0

        def init_forward_metadata(self, forward_batch: Any) -> None:
            self.metadata_preps += 1
            _metadata_prep(self, forward_batch)

        def shared_read_ends(self, fm: Any) -> Any:
            if fm == ForwardMode.EXTEND:
                return SharedReadEnds.PRE_REPLAY
            return super().shared_read_ends(fm)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the declared model body runs the attention")

    return PreReplayBackend


class EagerModel:
    """``model_runner.model``: ``forward(input_ids, positions, forward_batch)``."""

    shared_experts_config = None

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        return LogitsProcessorOutput(
            next_token_logits=_eager_model_forward(self.runner, forward_batch))
