"""EAGLE's target verify under SGLang's own CUDA-graph runner (SGLang's default).

With CUDA graphs on, the target model runner's ``decode_cuda_graph_runner`` is SGLang's
``DecodeCudaGraphRunner`` built for a speculative model runner: it captures
``ForwardMode.TARGET_VERIFY`` graphs of ``num_draft_tokens`` tokens per request.
``eagle_prepare_for_verify`` then calls its ``can_run_graph`` and ``load_batch`` *inside the
verify's plan-stream block* (``run_eagle_verify``): the batch (draft tokens, positions, verify
slots, rows, lengths, the tree mask) is copied into the graph's static buffers on the plan
stream, and the in-graph metadata is prepared from them at the replay. The verify forward
(``TpModelWorker.forward_batch_generation`` -> ``ModelRunner.forward``) replays the graph
with the runner's ``execute`` on the forward stream.

SGLang's: the runner class, its ``__init__`` (buffers, batch sizes, the verify spec info with
the static tree mask), ``capture`` on the FULL graph backend, ``can_run_graph``,
``load_batch``, ``execute`` and its read-done event. The harness's (the model is not loaded):

* :class:`VerifyAttentionBackend`: the attention backend's graph interface; its in-graph
  metadata prep is one declared op that reads the *static* rows and lengths and each row's
  ``req_to_token[row, :seq_len + draft_tokens]`` (prefix and verify slots), and writes the
  backend's private KV-index copy;
* :func:`_verify_forward`: the target model body inside the graph, one declared op: reads the
  static draft tokens, positions, verify slots (and, for trees, the static tree mask), the
  private KV indices and the KV they name; writes the verify slots' KV, the static logits and
  hidden-state buffers. Its logits are the eager fake target's (the same acceptance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.decode_graph import (
    build_runner,
    graph_platform,
    graph_server_args,
    publish_decode_graphs,
)
from overlap_harness.engines.sglang.features.eagle import Eagle
from overlap_harness.engines.sglang.stand_ins import eagle_models, graph_kernels
from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    PrivateIndexBackend,
    _kernel_values,
    copy_row_kv_indices,
)
from overlap_harness.engines.sglang.stand_ins.graph_model import GraphModelRunner
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


def _verify_rows(forward_batch: Any, width: int) -> list[tuple[int, int]]:
    """(row, prefix + verify length) of each static slot, from the buffers' current values."""
    with _kernel_values():
        rows = forward_batch.req_pool_indices.tolist()
        lengths = forward_batch.seq_lens.tolist()
    return [(row, length + width) for row, length in zip(rows, lengths, strict=True)]


def _prep_accesses(result: Any, backend: VerifyAttentionBackend, forward_batch: Any
                   ) -> list[DeclaredAccess]:
    out = reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    for row, length in _verify_rows(forward_batch, backend.width):
        out += reads(backend.req_to_token[row, :length])
    return out + writes(backend.kv_indices) + writes(backend.kv_indptr)


@declared(_prep_accesses, name="verify_attn_metadata_prep_in_graph")
def _verify_metadata_prep(backend: VerifyAttentionBackend, forward_batch: Any) -> None:
    """The backend's private copy of each row's prefix and verify KV indices."""
    with _kernel_values():  # device work only: captured (stand_ins/graph_attention.py)
        copy_row_kv_indices(backend, forward_batch.req_pool_indices,
                            forward_batch.seq_lens + backend.width)


class VerifyAttentionBackend(PrivateIndexBackend):
    """The target attention backend's graph interface for TARGET_VERIFY; shared reads end
    inside the replay (the base class's)."""

    def __init__(self, req_to_token: torch.Tensor, width: int, reads_tree_mask: bool) -> None:
        super().__init__(req_to_token)
        self.width = width
        self.reads_tree_mask = reads_tree_mask

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Captured: the private copy of the shared ``req_to_token`` rows."""
        _verify_metadata_prep(self, forward_batch)


def _forward_accesses(result: Any, runner: VerifyGraphModelRunner, forward_batch: Any
                      ) -> list[DeclaredAccess]:
    backend = runner.attn_backend
    bs = forward_batch.batch_size
    with _kernel_values():
        used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    if backend.reads_tree_mask:
        out += reads(forward_batch.spec_info.custom_mask)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    tokens = forward_batch.input_ids.shape[0]
    return (out + writes(forward_batch.next_token_logits_buffer)
            + writes(runner.hidden_buffer[:tokens]))


@declared(_forward_accesses, name="target_verify_forward_in_graph")
def _verify_forward(runner: VerifyGraphModelRunner, forward_batch: Any) -> None:
    """The eager fake target's values: logits a function of the positions, hidden states
    the draft tokens."""
    with _kernel_values():
        # index_fill_, not ``kv[index] = 1.0``: that moves a host scalar to the device, which a
        # capture refuses on a GPU (recorder/pageable.py)
        runner.kv_buffer.index_fill_(0, forward_batch.out_cache_loc.to(torch.int64), 1.0)
        tokens = forward_batch.input_ids.shape[0]
        logits = eagle_models.logits_of(forward_batch.positions, 0)
        forward_batch.next_token_logits_buffer[:tokens].copy_(logits)
        runner.hidden_buffer[:tokens].copy_(
            forward_batch.input_ids.to(torch.float32).view(-1, 1).expand(-1, eagle_models.HIDDEN))


class _VerifyModel:
    """``model_runner.model`` for capture: ``forward(input_ids, positions, forward_batch)``."""

    shared_experts_config = None

    def __init__(self, runner: VerifyGraphModelRunner) -> None:
        self.runner = runner

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        _verify_forward(self.runner, forward_batch)
        tokens = input_ids.shape[0]
        return LogitsProcessorOutput(next_token_logits=forward_batch.next_token_logits_buffer,
                                     hidden_states=self.runner.hidden_buffer[:tokens])


class VerifyGraphModelRunner(GraphModelRunner):
    """The target model runner's fields SGLang's graph runner reads for TARGET_VERIFY: an
    EAGLE model runner (not a draft worker) of ``num_draft_tokens`` tokens per request."""

    dtype = torch.float32

    def __init__(self, worker: Any, server_args: Any, num_draft_tokens: int,
                 tree_mask: bool) -> None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        fake = worker.model_runner
        super().__init__(worker.req_to_token_pool, fake.token_to_kv_pool_allocator,
                         worker.kv_buffer, fake.ngram_embedding_manager, server_args,
                         post_replay=False)
        self.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
        self.num_draft_tokens = num_draft_tokens
        self.attn_backend = VerifyAttentionBackend(worker.req_to_token_pool.req_to_token,
                                                   num_draft_tokens, tree_mask)
        self.model_config.vocab_size = eagle_models.VOCAB
        self.model_config.hidden_size = eagle_models.HIDDEN
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

        rows = worker.req_to_token_pool.size * num_draft_tokens
        # the logits rows the graphs share: one per verify token
        self.graph_shared_output = GraphSharedOutput(device=torch.device("cuda"), max_rows=rows)
        self.hidden_buffer = torch.zeros((rows, eagle_models.HIDDEN), dtype=torch.float32,
                                         device="cuda")
        self.model = _VerifyModel(self)

    def decode_num_tokens_per_req(self, num_draft_tokens: int | None = None) -> int:
        return self.num_draft_tokens


class VerifyGraphs:
    """SGLang's target-verify graph runner, built (graphs captured) at startup and handed
    to the target model runner as its ``decode_cuda_graph_runner``."""

    def __init__(self, worker: Any, server_args: Any, batch_sizes: tuple[int, ...],
                 num_draft_tokens: int, tree_mask: bool) -> None:
        server_args = graph_server_args(server_args, publish_decode_graphs(batch_sizes))
        self.model_runner = VerifyGraphModelRunner(worker, server_args, num_draft_tokens,
                                                   tree_mask)
        with graph_platform():
            self.runner = build_runner(self.model_runner)
        self.replays = 0

    def execute(self, forward_batch: Any) -> Any:
        """The replay of a verify batch ``load_batch`` already staged (SGLang's
        ``ModelRunner.forward`` -> ``decode_cuda_graph_runner.execute``)."""
        self.replays += 1
        return self.runner.execute(forward_batch)


def attach(scheduler: Any, server_args: Any, batch_sizes: tuple[int, ...],
           num_draft_tokens: int, tree_mask: bool) -> VerifyGraphs:
    """Give the EAGLE target worker SGLang's target-verify graph runner (captured now, at
    startup, as ``ModelRunner.init_device_graphs`` does)."""
    target = scheduler.tp_worker
    graphs = VerifyGraphs(target, server_args, batch_sizes, num_draft_tokens, tree_mask)
    target.model_runner.decode_cuda_graph_runner = graphs.runner
    target.verify_graphs = graphs
    return graphs


@dataclass(frozen=True, slots=True)
class CudaGraphVerify(Feature):
    """The EAGLE target verify replayed by SGLang's CUDA-graph runner (``load_batch`` stages
    the verify into its static buffers), capturing ``sizes`` at startup."""

    keys: ClassVar[tuple[str, ...]] = ("cuda_graph",)
    options: ClassVar[tuple[str, ...]] = ("--disable-cuda-graph", "--cuda-graph-bs")

    sizes: tuple[int, ...] = (1, 2)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"cuda_graph": "verify_and_draft_extend"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.DECODE_GRAPHS, rf.VERIFY_GRAPH_LOAD]

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (graph_kernels.declare,)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        eagle = variant.speculative  # Eagle or its multi-layer worker (a subclass)
        if not isinstance(eagle, Eagle):
            raise ValueError(f"{variant.name}: CudaGraphVerify needs the Eagle feature")
        attach(scheduler, server_args, self.sizes, eagle.num_draft_tokens, eagle.topk > 1)
