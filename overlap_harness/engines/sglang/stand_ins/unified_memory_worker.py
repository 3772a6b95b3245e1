"""The fake worker of a hybrid-SWA model under unified memory (the feature:
:mod:`..features.unified_memory`): each forward one declared op over the full and SWA
sub-pools' page envelopes of SGLang's unified pool, and, for a backend whose prefill reads
end in its metadata init, SGLang's own publish of the prefill's read-done event.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from overlap_harness.engines.sglang.stand_ins.model_worker import VOCAB, FakeModelWorker
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names SGLang's line that called the worker's forward


def _forward_accesses(tokens: torch.Tensor, worker: UnifiedMemoryWorker, batch: Any,
                      writes_at: tuple[torch.Tensor, torch.Tensor],
                      reads_at: list[tuple[torch.Tensor, torch.Tensor]]
                      ) -> list[DeclaredAccess]:
    """The forward's accesses (:class:`UnifiedMemoryWorker`)."""
    full, swa = worker.envelopes()
    out: list[DeclaredAccess] = []
    out += reads(batch.input_ids) + reads(batch.req_pool_indices) + reads(batch.seq_lens)
    full_write, swa_write = writes_at
    out += reads(full_write) + reads(swa_write)
    out += writes(full, rows=full_write) + writes(swa, rows=swa_write)
    for full_read, swa_read in reads_at:
        out += reads(full_read) + reads(full, rows=full_read)
        out += reads(swa_read) + reads(swa, rows=swa_read)
    out += writes(tokens)
    return out


@declared(_forward_accesses, name="model_forward")
def _unified_forward(worker: UnifiedMemoryWorker, batch: Any,
                     writes_at: tuple[torch.Tensor, torch.Tensor],
                     reads_at: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Values the sampler could have produced: each new slot's page envelopes (full and
    SWA) hold a function of its token; each request's token is a function of the envelopes
    its attention reads and its length."""
    full, swa = worker.envelopes()
    value = (batch.input_ids % 251 + 1).to(torch.uint8).view(-1, 1)
    full[writes_at[0]] = value
    swa[writes_at[1]] = value
    sums = [full[full_read].to(torch.int64).sum() + swa[swa_read].to(torch.int64).sum()
            + full_read.numel() for full_read, swa_read in reads_at]
    if not sums:
        return torch.zeros(0, dtype=torch.int64, device=batch.seq_lens.device)
    return torch.stack(sums) % VOCAB


class UnifiedMemoryWorker(FakeModelWorker):
    """The model forward of a hybrid-SWA model over SGLang's unified pool: as SGLang's
    attention backends do once per forward, the batch's virtual ids are translated with the
    allocator's own ``translate_write_loc`` (``out_cache_loc``), ``translate_kv_loc`` (the
    full layer's reads: each request's whole sequence) and
    ``translate_loc_from_full_to_swa`` (the SWA layer's reads: the last ``window`` tokens);
    then one op (set_kv_buffer of both layers, attention, sampling) writes the new slots'
    page envelopes and reads those of the translated ids."""

    window: int
    prefill_reads_end_pre_replay: bool

    def envelopes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The full and the SWA sub-pool's page envelopes (rows of the shared buffer)."""
        kv_pool = self.model_runner.token_to_kv_pool_allocator.get_kvcache()
        return (kv_pool.full_kv_pool.get_page_envelope_buffer(),
                kv_pool.swa_kv_pool.get_page_envelope_buffer())

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        """One forward of ``batch`` on the current stream; SGLang's ``GenerationBatchResult``."""
        from sglang.srt.managers.utils import GenerationBatchResult

        from overlap_harness.engines.sglang.stand_ins.model_worker import _logits_output

        if kwargs:
            raise TypeError(f"forward_batch_generation: unplanned arguments {sorted(kwargs)}")
        self.forwards += 1
        allocator = self.model_runner.token_to_kv_pool_allocator
        req_to_token = self.req_to_token_pool.req_to_token
        writes_at = (allocator.translate_write_loc(batch.out_cache_loc),
                     allocator.translate_loc_from_full_to_swa(batch.out_cache_loc))
        reads_at = []
        for row, seq_len in zip(batch.req_pool_indices_cpu.tolist(),
                                batch.seq_lens_cpu.tolist(), strict=True):
            reads_at.append((
                allocator.translate_kv_loc(req_to_token[row, :seq_len]),
                allocator.translate_loc_from_full_to_swa(
                    req_to_token[row, max(0, seq_len - self.window):seq_len])))
        if self.prefill_reads_end_pre_replay and batch.forward_mode.is_extend():
            _publish_prefill_read_done(self.model_runner, batch)
        tokens = _unified_forward(self, batch, writes_at, reads_at)
        return GenerationBatchResult(logits_output=_logits_output(), next_token_ids=tokens,
                                     can_run_cuda_graph=False)


def _prefill_reads_end(forward_mode: Any) -> Any:
    """The stand-in backend's answer to where a forward's shared reads end: a prefill's in
    its metadata init (``PRE_REPLAY``, as TRT-LLM MHA declares for EXTEND), anything else's
    after the forward (None: no early event)."""
    from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

    return SharedReadEnds.PRE_REPLAY if forward_mode.is_extend() else None


def _publish_prefill_read_done(model_runner: Any, batch: Any) -> None:
    """SGLang's own publish of a prefill's read-done event after its metadata reads (the
    translations above), with the backend's answer: in releases whose publish takes the
    resolved answer (0.5.23), the answer; in those that ask the backend themselves
    (``shared_read_ends``, 0.5.22), the batch."""
    from sglang.srt.model_executor.runner_utils.shared_read_event import (
        maybe_publish_prefill_shared_read_done,
    )

    takes_answer = "shared_read_ends" in inspect.signature(
        maybe_publish_prefill_shared_read_done).parameters
    maybe_publish_prefill_shared_read_done(
        model_runner, _prefill_reads_end(batch.forward_mode) if takes_answer else batch,
        torch.cuda)
