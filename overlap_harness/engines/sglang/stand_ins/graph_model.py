"""The model under SGLang's decode CUDA-graph runner, as the harness declares it (the
feature: :mod:`..features.decode_graph`).

The model is not loaded, and these need weights, NCCL or kernels:

* :class:`DeclaredAttentionBackend` stands where SGLang's attention backend stands. Its
  in-graph metadata prep is one declared op that reads the *static* ``req_pool_indices`` and
  ``seq_lens`` and, per row, ``req_to_token[row, :seq_len]``, and writes the backend's private
  KV-index buffer (a backend that builds its decode metadata inside the graph, as 0.5.17's
  TRTLLM-MHA does: 0.5.17 records its read-done event before the replay, a real race
  there, docs/sglang-release-driving.md); after it, the attention reads only that private
  copy. Its ``shared_read_ends`` is the base class's (SGLang's): decode reads
  end ``IN_REPLAY``. ``post_replay=True`` declares ``POST_REPLAY`` instead (a backend without a
  metadata snapshot: the runner then records a fresh event after the replay);
  ``pre_replay=True`` builds the private copy in ``init_forward_metadata_out_graph``, before
  the replay, and declares ``PRE_REPLAY`` (a backend whose decode metadata is prepared out of
  the graph, as 0.5.17's FlashInfer, Triton and FA3 are).
* :func:`_graph_model_forward`: the model body, one declared op inside the graph: reads the
  static ``input_ids``/``positions``, the private KV indices and the KV slots they name,
  writes the static ``out_cache_loc`` slots of the KV buffer and the static logits buffer.
* the model runner (:class:`GraphModelRunner`) lists the fields the runner reads, for one
  rank and no weights; :func:`_sample` samples the replay's logits greedily.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    PrivateIndexBackend,
    _kernel_values,
    _static_rows,
    copy_row_kv_indices,
)
from overlap_harness.engines.sglang.stand_ins.model_worker import ReadDoneEventNames
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes


def _metadata_prep_accesses(result: Any, backend: DeclaredAttentionBackend,
                            forward_batch: Any) -> list[DeclaredAccess]:
    req_to_token = backend.req_to_token
    out = reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    for row, seq_len in _static_rows(forward_batch.req_pool_indices, forward_batch.seq_lens):
        out += reads(req_to_token[row, :seq_len])
    return out + writes(backend.kv_indices) + writes(backend.kv_indptr)


@declared(_metadata_prep_accesses, name="attn_metadata_prep_in_graph")
def _metadata_prep(backend: DeclaredAttentionBackend, forward_batch: Any) -> None:
    """The backend's private copy of each row's KV indices (``kv_indptr``/``kv_indices``).

    Device work only, of static shapes (a CUDA graph captures it: no host read of a device
    value, no host-to-device copy): slot ``s``'s entries are ``req_to_token[row_s, :len_s]``
    at ``kv_indptr[s]``; entries past a row's length go to ``kv_indices``' last element, a
    trash slot no read takes."""
    with _kernel_values():
        copy_row_kv_indices(backend, forward_batch.req_pool_indices, forward_batch.seq_lens)


@declared(_metadata_prep_accesses, name="attn_metadata_prep_out_graph")
def _metadata_prep_out_graph(backend: DeclaredAttentionBackend, forward_batch: Any) -> None:
    """The same private copy, made before the replay (eager, on the current stream)."""
    with _kernel_values():
        copy_row_kv_indices(backend, forward_batch.req_pool_indices, forward_batch.seq_lens)


def _forward_accesses(result: Any, runner: GraphModelRunner, forward_batch: Any
                      ) -> list[DeclaredAccess]:
    backend = runner.attn_backend
    bs = forward_batch.batch_size
    used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    return out + writes(forward_batch.next_token_logits_buffer)


@declared(_forward_accesses, name="model_forward_in_graph")
def _graph_model_forward(runner: GraphModelRunner, forward_batch: Any) -> None:
    """Values a model could produce, as the eager forward makes them
    (``stand_ins/model_worker.py``): each new KV slot holds its input token + 1, and each row's
    logits are one-hot at the sum of the KV its private indices name plus its length (mod the
    vocabulary). Device work only, of static shapes (captured: no host read of a device value)."""
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
        logits = forward_batch.next_token_logits_buffer
        logits.zero_()
        token = torch.remainder(sums, logits.shape[1]).unsqueeze(1)
        logits[:bs].scatter_(1, token, 1.0)


class DeclaredAttentionBackend(PrivateIndexBackend):
    """The decode attention backend: its one scheduler-shared read declared
    (``_metadata_prep``); ``post_replay`` declares its shared reads ending after the
    replay (``SharedReadEnds.POST_REPLAY``); ``pre_replay`` makes the copy before the
    replay, out of the graph (``SharedReadEnds.PRE_REPLAY``)."""

    needs_cpu_seq_lens = True

    def __init__(self, req_to_token: torch.Tensor, *, post_replay: bool,
                 pre_replay: bool = False) -> None:
        if post_replay and pre_replay:
            raise ValueError("a backend's shared reads end either before or after the replay")
        super().__init__(req_to_token)
        self.post_replay = post_replay
        self.pre_replay = pre_replay

    def shared_read_ends(self, forward_mode: Any) -> Any:
        from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

        if self.post_replay:
            return SharedReadEnds.POST_REPLAY
        if self.pre_replay:
            return SharedReadEnds.PRE_REPLAY
        return super().shared_read_ends(forward_mode)

    def init_forward_metadata_out_graph(self, forward_batch: Any,
                                        in_capture: bool = False) -> None:
        """Before each replay (and the capture): the private copy, when made out of the
        graph."""
        if self.pre_replay:
            _metadata_prep_out_graph(self, forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Captured: the private copy of the shared ``req_to_token`` rows (unless it is
        made before the replay)."""
        if not self.pre_replay:
            _metadata_prep(self, forward_batch)


class _GraphModel:
    """``model_runner.model`` for capture: ``forward(input_ids, positions, forward_batch)``."""

    shared_experts_config = None

    def __init__(self, runner: GraphModelRunner) -> None:
        self.runner = runner

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        _graph_model_forward(self.runner, forward_batch)
        return LogitsProcessorOutput(next_token_logits=forward_batch.next_token_logits_buffer)


class GraphModelRunner(ReadDoneEventNames):
    """The model-runner fields SGLang's decode graph runner reads, for one rank and no
    weights."""

    is_draft_worker = False
    attn_dcp_size = 1  # no decode context parallelism (0.5.21's ForwardBatch reads it here)
    device = "cuda"
    gpu_id = 0
    lora_manager = None
    hisparse_coordinator = None
    canary_manager = None
    _kernel_warmed_up = True  # no kernels to autotune
    device_timer = None

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_buffer: torch.Tensor,
                 ngram_manager: Any, server_args: Any, *, post_replay: bool,
                 pre_replay: bool = False) -> None:
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.req_to_token_pool = req_to_token_pool
        self.kv_buffer = kv_buffer
        # what the decode runner publishes and the scheduler's WAR barrier takes (and clears)
        self.shared_read_done_event: torch.cuda.Event | None = None
        self.server_args = server_args
        self.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        self.ngram_embedding_manager = ngram_manager
        self.attn_backend = DeclaredAttentionBackend(req_to_token_pool.req_to_token,
                                                     post_replay=post_replay,
                                                     pre_replay=pre_replay)
        self.model_config = StrictStub(
            "model_config", absent=("hc_hidden_size",), is_encoder_decoder=False,
            hidden_size=8, dtype=torch.float32, requires_mm_token_modalities=False,
            model_is_mrope=False,
            vocab_size=1000, hf_config=_hf_config(), hf_text_config=_hf_config())
        self.graph_shared_output = GraphSharedOutput(device=torch.device("cuda"),
                                                     max_rows=req_to_token_pool.size)
        self.model = _GraphModel(self)
        self.capture_head_hooks: list[Any] = []
        self.capture_tail_hooks: list[Any] = []
        if (translator := _translator(req_to_token_pool, allocator)) is not None:
            self.kv_index_translator = translator

    def decode_num_tokens_per_req(self, num_draft_tokens: int | None = None) -> int:
        return 1

    def attn_tp_sequence_sharded(self, num_tokens: int) -> bool:
        return False

    def get_pp_proxy_topk_size(self) -> int:
        return 0

    def get_pp_proxy_residual_num_blocks(self) -> int:
        return 0

    def get_pp_proxy_dspark_hidden_size(self) -> int:
        return 0

    def get_aux_hidden_states_width(self) -> int:
        return 0


def _translator(req_to_token_pool: Any, allocator: Any) -> Any:
    """SGLang's ``KVIndexTranslator`` for a plain (untranslated) pool of page size 1; None in
    a release without it (its runners have no translator)."""
    import importlib.util

    if importlib.util.find_spec("sglang.srt.mem_cache.kv_index_translator") is None:
        return None
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    return KVIndexTranslator(req_to_token=req_to_token_pool.req_to_token,
                             token_to_kv_pool_allocator=allocator,
                             token_to_kv_pool=allocator.get_kvcache(), page_size=1,
                             device="cuda")


def _hf_config() -> Any:
    """A plain transformers config (no attention variants, no DSA, no encoder)."""
    from transformers import PretrainedConfig

    return PretrainedConfig(architectures=["LlamaForCausalLM"])


def _sample_accesses(result: torch.Tensor, logits: torch.Tensor) -> list[DeclaredAccess]:
    return reads(logits) + writes(result)


@declared(_sample_accesses, name="sampler")
def _sample(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling of the replay's logits rows (a view of the static logits buffer) into
    a fresh token tensor, on the forward stream after the replay."""
    with _kernel_values():
        return logits.argmax(dim=-1).to(torch.int64)


class GraphForwards:
    """The worker's decode path under CUDA graphs, where ``ModelRunner.forward``'s graph
    branch and the sampler stand: each decode batch it can run is a ``ForwardBatch`` made by
    SGLang's ``ForwardBatch.init_new`` and replayed by SGLang's runner's ``execute``, then
    sampled (the runner is built and its graphs captured by
    :func:`~overlap_harness.engines.sglang.features.decode_graph.build_forwards`)."""

    def __init__(self, model_runner: GraphModelRunner, runner: Any) -> None:
        self.model_runner = model_runner
        self.runner = runner
        self.replays = 0

    def forward(self, batch: Any) -> tuple[Any, torch.Tensor] | None:
        """Replay the graph for ``batch`` (a decode ``ModelWorkerBatch``): its logits output
        and sampled tokens; None when the runner cannot run it (the caller runs it eagerly)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        forward_batch = ForwardBatch.init_new(batch, self.model_runner,
                                              return_hidden_states_before_norm=False)
        if not self.runner.can_run_graph(forward_batch):
            return None
        output = self.runner.execute(forward_batch)
        self.replays += 1
        return output, _sample(output.next_token_logits)
