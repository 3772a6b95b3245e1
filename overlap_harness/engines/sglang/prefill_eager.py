"""Forwards through SGLang's own ``EagerRunner`` with a backend whose prefill reads end early.

The runner is SGLang's class, built by its own ``__init__`` (the eager static-input registry,
``build_eager_registry``) and run by its own ``execute``: ``load_batch`` copies each batch
into the registry's buffers on the forward stream; ``_execute_extend`` then calls the
attention backend's ``init_forward_metadata``, asks it where the prefill's scheduler-shared
reads end (``resolve_prefill_shared_read_ends``, SGLang's base-class method) and hands the
answer to SGLang's ``maybe_publish_prefill_shared_read_done``, which records the read-done
event on the forward stream and publishes it on the model runner, where the scheduler's WAR
barrier (``Scheduler._apply_war_barrier``) takes it instead of waiting on the whole forward
stream. Decode batches go through the same runner's ``_execute_decode`` (no event: the barrier
waits on the forward stream).

What is the harness's (no weights, no attention kernels):

* the attention backend: a subclass of SGLang's ``AttentionBackend`` (its
  ``resolve_prefill_shared_read_ends`` and snapshot hooks are SGLang's) that declares
  ``SharedReadEnds.PRE_REPLAY`` for EXTEND, as TRT-LLM MHA does (trtllm_mha_backend.py:
  "Prefill metadata init snapshots all scheduler-shared inputs pre-replay"), and keeps that
  promise: its ``init_forward_metadata`` is one declared op that reads, per row,
  ``req_to_token[row, :seq_len]`` and writes the backend's private KV-index copy; the model
  reads only that copy afterwards;
* the model body: one declared op (:func:`_eager_model_forward`) reading the runner's static
  inputs, the private KV indices and the KV slots they name, writing the new KV slots and a
  fresh logits tensor; then the graph path's declared sampler.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.eagle_kernels import _positions, _positions_accesses
from overlap_harness.engines.sglang.graph_attention import copy_row_kv_indices
from overlap_harness.engines.sglang.graph_runner import (
    GraphModelRunner,
    _kernel_values,
    _sample,
    _static_rows,
    graph_platform,
)
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

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


def _forward_accesses(result: Any, runner: EagerModelRunner, forward_batch: Any
                      ) -> list[DeclaredAccess]:
    backend = runner.attn_backend
    bs = forward_batch.batch_size
    used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    return out + writes(result.next_token_logits)


@declared(_forward_accesses, name="model_forward (eager)")
def _eager_model_forward(runner: EagerModelRunner, forward_batch: Any) -> Any:
    """Values a model could produce, as the fake worker's forward makes them (worker.py):
    each new KV slot holds its input token + 1; each request's logits row is one-hot at the
    sum of the KV its private indices name plus its length (mod the vocabulary)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    backend = runner.attn_backend
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
        logits = torch.zeros((bs, VOCAB), dtype=torch.float32, device=starts.device)
        logits.scatter_(1, torch.remainder(sums, VOCAB).unsqueeze(1), 1.0)
    return LogitsProcessorOutput(next_token_logits=logits)


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


class _EagerModel:
    """``model_runner.model``: ``forward(input_ids, positions, forward_batch)``."""

    shared_experts_config = None

    def __init__(self, runner: EagerModelRunner) -> None:
        self.runner = runner

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        return _eager_model_forward(self.runner, forward_batch)


class EagerModelRunner(GraphModelRunner):
    """The model-runner fields SGLang's eager runner reads (the graph runner's, with the
    pool sizes it sizes its registry by), its backend the PRE_REPLAY stand-in."""

    # the backend name ForwardBatch.init_new's extend positions go by (Triton's kernel for
    # any backend but the torch-native ones); TRT-LLM MHA's, whose read end the stand-in's is
    prefill_attention_backend_str = "trtllm_mha"
    support_pp = False
    is_generation = True
    kv_cache_dtype = torch.float32

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_buffer: torch.Tensor,
                 ngram_manager: Any, server_args: Any) -> None:
        super().__init__(req_to_token_pool, allocator, kv_buffer, ngram_manager, server_args,
                         post_replay=False)
        self.max_running_requests = req_to_token_pool.size
        self.max_total_num_tokens = kv_buffer.shape[0] - 1
        self.attn_backend = pre_replay_backend_class()(req_to_token_pool.req_to_token,
                                                       self.max_running_requests)
        self.model = _EagerModel(self)

    def _pp_kwargs(self, pp_proxy_tensors: Any) -> dict:
        """No pipeline parallelism: no extra forward arguments (ModelRunner's rule)."""
        return {}

    def _extend_forward_kwargs(self, forward_batch: Any, pp_proxy_tensors: Any) -> dict:
        """A generation model of token inputs: no embeddings overrides (ModelRunner's
        rule gives none for such a batch)."""
        if forward_batch.input_embeds is not None or forward_batch.replace_embeds is not None:
            raise NotImplementedError("input embeddings are not driven")
        return {}


class EagerForwards:
    """The worker's forwards through SGLang's ``EagerRunner``: each batch a ``ForwardBatch``
    made by SGLang's ``ForwardBatch.init_new``, run by the runner's ``execute`` inside the
    forward context ``ModelRunner._forward_raw`` opens, then sampled."""

    def __init__(self, worker: Any, server_args: Any, parallel_state: Any = None) -> None:
        from sglang.srt.model_executor.runner.eager_runner import EagerRunner

        fake = worker.model_runner
        self.model_runner = EagerModelRunner(
            worker.req_to_token_pool, fake.token_to_kv_pool_allocator, worker.kv_buffer,
            fake.ngram_embedding_manager, server_args)
        if parallel_state is not None:
            self.model_runner.ps = parallel_state
        with graph_platform():
            self.runner = EagerRunner(self.model_runner)
        self.extends = 0
        self.decodes = 0

    def forward(self, batch: Any) -> Any:
        """One forward of ``batch`` (a ``ModelWorkerBatch``) on the current stream; SGLang's
        ``GenerationBatchResult``."""
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
        from sglang.srt.runtime_context import get_model

        forward_batch = ForwardBatch.init_new(batch, self.model_runner,
                                              return_hidden_states_before_norm=False)
        if forward_batch.forward_mode.is_decode():
            self.decodes += 1
        else:
            self.extends += 1
        context = ForwardContext(attn_backend=self.model_runner.attn_backend)
        with (get_model().override(shared_experts=None),
              forward_context(context, forward_batch=forward_batch)):
            output = self.runner.execute(forward_batch)
        return GenerationBatchResult(logits_output=output,
                                     next_token_ids=_sample(output.next_token_logits),
                                     can_run_cuda_graph=False)


def declare() -> None:
    """Register the declarations the eager prefill path needs (idempotent; before the
    watch): the extend positions' Triton kernel ``ForwardBatch.init_new`` launches."""
    recorder.declare_kernel("sglang.srt.model_executor.forward_batch_info:"
                            "compute_position_triton", _positions_accesses,
                            cpu_impl=_positions, name="compute_position_kernel")


def attach(scheduler: Any, server_args: Any) -> EagerForwards:
    """Give the scheduler's fake worker SGLang's eager runner (built at startup, as
    ``ModelRunner`` builds it before the loop starts)."""
    worker = scheduler.model_worker
    forwards = EagerForwards(worker, server_args, getattr(scheduler, "ps", None))
    worker.eager_forwards = forwards
    return forwards
