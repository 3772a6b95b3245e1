"""The fake model worker: what the real forward reads and writes, declared, and nothing else.

It replaces SGLang's ``TpModelWorker`` (and with it the model runner, attention backend and
sampler, which need weights and CUDA kernels). Each forward is one declared op on the current
(forward) stream, with the accesses of the real kernels of a non-spec forward:

* ``set_kv_buffer``: writes the batch's new KV slots (``out_cache_loc``) of the KV pool;
* attention: reads, for each request row, ``req_to_token[row, :seq_len]`` (not the whole row:
  a whole-row read finds write-after-read races the real kernel does not have) and the KV
  slots those entries name;
* embedding and sampling: reads ``input_ids``, ``req_pool_indices``, ``seq_lens``; writes the
  sampled ``next_token_ids`` (a fresh tensor).

The decode runner's ``shared_read_done_event`` (the event the scheduler's WAR barrier waits on
instead of the whole forward stream) is recorded after attention in decode batches when the
worker plays a CUDA-graph runner, and left None otherwise (eager and prefill runners publish
none), as SGLang's runners do.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

VOCAB = 1000


def _rows_and_lengths(batch: Any) -> list[tuple[int, int]]:
    """Each request's pool row and sequence length, from what the host already holds
    (``req_pool_indices_cpu``, ``seq_lens_cpu``): reading the device tensors would block the
    host, which the real forward never does."""
    return list(zip(batch.req_pool_indices_cpu.tolist(), batch.seq_lens_cpu.tolist(),
                    strict=True))


def _forward_accesses(tokens: torch.Tensor, worker: FakeModelWorker, batch: Any
                      ) -> list[DeclaredAccess]:
    """The real forward's accesses (module docstring), from the batch as launched."""
    req_to_token = worker.req_to_token_pool.req_to_token
    out: list[DeclaredAccess] = []
    out += reads(batch.input_ids) + reads(batch.req_pool_indices) + reads(batch.seq_lens)
    out += reads(batch.out_cache_loc)
    out += writes(worker.kv_buffer, rows=batch.out_cache_loc)
    for row, seq_len in _rows_and_lengths(batch):
        entries = req_to_token[row, :seq_len]
        out += reads(entries)
        out += reads(worker.kv_buffer, rows=entries)
    out += writes(tokens)
    return out


@declared(_forward_accesses, name="model_forward")
def _model_forward(worker: FakeModelWorker, batch: Any) -> torch.Tensor:
    """Values the sampler could have produced: a function of the KV the forward reads (the
    tokens of the request's slots) and its length. Only
    device work (no host read of device memory), as a real forward launches."""
    req_to_token = worker.req_to_token_pool.req_to_token
    # set_kv_buffer: each new slot holds a function of its token, so a read of a wrong slot,
    # a stale token or an unwritten slot changes the sampled token (a GPU run compares them)
    worker.kv_buffer[batch.out_cache_loc] = (batch.input_ids.to(torch.float32) + 1.0).view(-1, 1)
    sums = [worker.kv_buffer[req_to_token[row, :seq_len].to(torch.int64)].sum() + seq_len
            for row, seq_len in _rows_and_lengths(batch)]
    if not sums:
        return torch.zeros(0, dtype=torch.int64, device=batch.seq_lens.device)
    return torch.stack(sums).to(torch.int64) % VOCAB


class ReadDoneEventNames:
    """The runner's read-done event under both names releases give it: the WAR barrier of
    0.5.17's loop reads ``war_fastpath_read_done_event`` (of the worker's
    ``war_fastpath_runner``), later releases ``shared_read_done_event`` (of its
    ``last_shared_read_runner``). One event; each release's code reads the name it has."""

    shared_read_done_event: torch.cuda.Event | None

    @property
    def war_fastpath_read_done_event(self) -> torch.cuda.Event | None:
        """The read-done event under its older name."""
        return self.shared_read_done_event

    @war_fastpath_read_done_event.setter
    def war_fastpath_read_done_event(self, event: torch.cuda.Event | None) -> None:
        self.shared_read_done_event = event


class FakeRunner(ReadDoneEventNames):
    """The model runner fields the scheduler reads: its attention backend (SGLang asks it
    for ``extend_attention_block_m`` and whether CPU sequence lengths are needed) and the
    ``shared_read_done_event`` of the last forward."""

    def __init__(self, req_to_token_pool: Any, allocator: Any) -> None:
        # not a Triton backend: no extend_attention_block_m (the scheduler then uses 64)
        self.attn_backend = StrictStub("attn_backend", needs_cpu_seq_lens=True,
                                       absent=("extend_attention_block_m",))
        self.shared_read_done_event: torch.cuda.Event | None = None
        self.req_to_token_pool = req_to_token_pool
        self.model_config = StrictStub("model_config", use_ngram_embedding=False,
                                       use_engram=False)
        self.token_to_kv_pool_allocator = allocator
        self.prefill_aware_swa = False
        self.canary_manager = None
        self.ngram_embedding_manager = _ngram_manager(req_to_token_pool)


class FakeModelWorker:
    """Stands where SGLang's ``TpModelWorker`` stands: ``forward_batch_generation`` and the
    few fields the scheduler reads of it."""

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_tokens: int, *,
                 graph_runner: bool) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.model_runner = FakeRunner(req_to_token_pool, allocator)
        self.model_config = self.model_runner.model_config
        self.graph_runner = graph_runner
        # one value per KV slot: what attention reads and set_kv_buffer writes
        self.kv_buffer = torch.zeros((kv_tokens + 1, 1), dtype=torch.float32, device="cuda")
        self.forwards = 0
        # SGLang's decode CUDA-graph runner (graph_model.GraphForwards), when a variant asks
        self.decode_graphs: Any = None
        # SGLang's eager runner for every forward (eager_model.EagerForwards), when asked
        self.eager_forwards: Any = None

    @property
    def last_shared_read_runner(self) -> FakeRunner:
        """The runner whose event the WAR barrier waits on: the one the decode graph runner
        publishes on when graphs are on (or SGLang's eager runner's), else the fake runner."""
        if self.eager_forwards is not None:
            return self.eager_forwards.model_runner
        if self.decode_graphs is not None:
            return self.decode_graphs.model_runner
        return self.model_runner

    @property
    def war_fastpath_runner(self) -> FakeRunner:
        """:attr:`last_shared_read_runner` under its older name (:class:`ReadDoneEventNames`)."""
        return self.last_shared_read_runner

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        """One forward of ``batch`` on the current stream; SGLang's ``GenerationBatchResult``."""
        from sglang.srt.managers.utils import GenerationBatchResult

        if kwargs:
            raise TypeError(f"forward_batch_generation: unplanned arguments {sorted(kwargs)}")
        self.forwards += 1
        if self.eager_forwards is not None:
            return self.eager_forwards.forward(batch)
        if self.decode_graphs is not None and batch.forward_mode.is_decode():
            replayed = self.decode_graphs.forward(batch)
            if replayed is not None:
                logits_output, tokens = replayed
                return GenerationBatchResult(logits_output=logits_output, next_token_ids=tokens,
                                             can_run_cuda_graph=True)
        tokens = _model_forward(self, batch)
        if self.graph_runner and batch.forward_mode.is_decode():
            event = torch.cuda.Event()
            event.record()
            self.model_runner.shared_read_done_event = event
        return GenerationBatchResult(logits_output=_logits_output(), next_token_ids=tokens,
                                     can_run_cuda_graph=self.graph_runner)


def _logits_output() -> Any:
    """SGLang's ``LogitsProcessorOutput`` with nothing but what a no-logprob batch reads."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    return LogitsProcessorOutput(next_token_logits=None)


def _ngram_manager(req_to_token_pool: Any) -> Any:
    """SGLang's ``NgramEmbeddingManager`` for a model without n-gram embeddings (disabled)."""
    from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
        NgramEmbeddingManager,
    )

    arguments: dict[str, Any] = {}
    if "server_args" in inspect.signature(NgramEmbeddingManager.from_model).parameters:
        # releases that read the option from the server arguments (later: the model config)
        from sglang.srt.server_args import get_global_server_args

        arguments["server_args"] = get_global_server_args()
    return NgramEmbeddingManager.from_model(
        model=StrictStub("model"),
        model_config=StrictStub("model_config", use_engram=False, ngram_embedding_n=0,
                                use_ngram_embedding=False),
        req_to_token_pool=req_to_token_pool, max_running_requests=1, device="cuda",
        **arguments)
