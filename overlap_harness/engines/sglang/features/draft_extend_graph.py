"""EAGLE's draft extend under SGLang's own ``EAGLEDraftExtendCudaGraphRunner``.

With CUDA graphs on, the EAGLE draft worker captures its draft extend (``DRAFT_EXTEND_V2``,
``num_draft_tokens`` tokens per request). In ``_draft_extend_for_decode`` the plan-stream
block then only builds the ``ForwardBatch`` (``prepare_for_draft_extend`` asks the runner's
``can_run_graph`` and plans no metadata); the runner's ``execute`` copies the batch into its
static buffers on the forward stream and replays. The draft extend is the step's last shared
reader, so ``execute`` would publish the read-done event the scheduler's WAR barrier waits
on, but only where the backend declares where its reads end: SGLang's base answer for
``DRAFT_EXTEND_V2`` is ``UNKNOWN`` (0.5.23: no CUDA backend overrides it for the draft
extend), so no event is published and the barrier falls back to the whole forward stream.

SGLang's: the runner class, its ``__init__`` (static buffers, capture of each batch size on
the FULL graph backend), ``can_run_graph``, ``execute`` and the read-done publish. The
harness's (no draft model is loaded):

* :class:`DraftExtendAttentionBackend`: its in-graph metadata prep is one declared op that
  reads the static rows and lengths (the lengths after the extend) and each row's
  ``req_to_token[row, :seq_len]``, and writes the backend's private KV-index copy;
* :func:`_draft_extend_forward`: the draft model inside the graph, one declared op: reads
  the static tokens, positions, carried hidden states, verify slots, the private KV indices
  and the draft KV they name, and ``select_index``; writes the draft KV of the slots, the
  selected rows' logits and hidden states. Its values are the eager fake draft's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.decode_graph import (
    graph_platform,
    graph_server_args,
    publish_decode_graphs,
)
from overlap_harness.engines.sglang.stand_ins import eagle_models
from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    PrivateIndexBackend,
    _kernel_values,
    copy_row_kv_indices,
    private_index_accesses,
)
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

RUNNER_MODULE = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"


def _rows(forward_batch: Any) -> list[tuple[int, int]]:
    with _kernel_values():
        return list(zip(forward_batch.req_pool_indices.tolist(),
                        forward_batch.seq_lens.tolist(), strict=True))


def _prep_accesses(result: Any, backend: DraftExtendAttentionBackend, forward_batch: Any
                   ) -> list[DeclaredAccess]:
    return private_index_accesses(backend, forward_batch, _rows(forward_batch))


@declared(_prep_accesses, name="draft_extend_metadata_prep_in_graph")
def _metadata_prep(backend: DraftExtendAttentionBackend, forward_batch: Any) -> None:
    """The backend's private copy of each row's KV indices (prefix and extended slots)."""
    with _kernel_values():  # device work only: captured (stand_ins/graph_attention.py)
        copy_row_kv_indices(backend, forward_batch.req_pool_indices, forward_batch.seq_lens)


class DraftExtendAttentionBackend(PrivateIndexBackend):
    """The draft-extend attention backend's graph interface; where its shared reads end is
    the base class's answer (``UNKNOWN`` for the draft extend)."""

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Captured: the private copy of the shared ``req_to_token`` rows."""
        _metadata_prep(self, forward_batch)


def _forward_accesses(result: Any, graphs: DraftExtendGraphs, forward_batch: Any
                      ) -> list[DeclaredAccess]:
    backend, runner = graphs.backend, graphs.draft_runner
    bs = forward_batch.batch_size
    spec = forward_batch.spec_info
    with _kernel_values():
        used = int(backend.kv_indptr[bs].item())
    out = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    out += reads(spec.hidden_states)
    if spec.select_index is not None:
        out += reads(spec.select_index)
    out += reads(forward_batch.out_cache_loc) + reads(backend.kv_indptr[:bs + 1])
    out += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc)
    entries = backend.kv_indices[:used]
    out += reads(entries) + reads(runner.kv_buffer, rows=entries)
    return (out + writes(forward_batch.next_token_logits_buffer)
            + writes(graphs.hidden_buffer[:_output_rows(forward_batch)]))


def _output_rows(forward_batch: Any) -> int:
    """Rows the graph's forward outputs: one per request where the release selects each
    request's last accepted token inside the graph (``spec_info.select_index``, 0.5.18 on),
    else one per token (0.5.17: the worker selects after the replay)."""
    if forward_batch.spec_info.select_index is not None:
        return forward_batch.spec_info.select_index.shape[0]
    return forward_batch.input_ids.shape[0]


@declared(_forward_accesses, name="draft_extend_forward_in_graph")
def _draft_extend_forward(graphs: DraftExtendGraphs, forward_batch: Any) -> None:
    """The eager fake draft's values for the output rows (:func:`_output_rows`: the last
    accepted token of each request, or every token): logits a function of the position,
    hidden states the token."""
    with _kernel_values():
        graphs.draft_runner.kv_buffer.index_fill_(0, forward_batch.out_cache_loc.to(torch.int64),
                                                  1.0)  # no host scalar copied in a capture
        select = forward_batch.spec_info.select_index
        positions, tokens = forward_batch.positions, forward_batch.input_ids
        if select is not None:
            select = select.to(torch.int64)
            positions, tokens = positions[select], tokens[select]
        logits = eagle_models.logits_of(positions + 1, 1)
        rows = logits.shape[0]
        forward_batch.next_token_logits_buffer[:rows].copy_(logits)
        graphs.hidden_buffer[:rows].copy_(tokens.to(torch.float32).view(-1, 1)
                                          .expand(-1, eagle_models.HIDDEN))


class _DraftModel:
    """``draft_runner.model`` for capture: ``forward(input_ids, positions, forward_batch)``."""

    shared_experts_config = None

    def __init__(self, graphs: DraftExtendGraphs) -> None:
        self.graphs = graphs

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        _draft_extend_forward(self.graphs, forward_batch)
        rows = _output_rows(forward_batch)
        return LogitsProcessorOutput(
            next_token_logits=forward_batch.next_token_logits_buffer[:rows],
            hidden_states=self.graphs.hidden_buffer[:rows])


class DraftExtendGraphs:
    """SGLang's draft-extend graph runner over the fake draft runner, captured at startup
    and handed to the draft worker (``cuda_graph_runner_for_draft_extend``)."""

    def __init__(self, draft_worker: Any, batch_sizes: tuple[int, ...]) -> None:
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
        from sglang.srt.model_executor.runner_utils import pool
        from sglang.srt.runtime_context import get_parallel
        from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
            EAGLEDraftExtendCudaGraphRunner,
        )

        from overlap_harness.engines.core.strict import StrictStub

        config = publish_decode_graphs(batch_sizes)
        runner = self.draft_runner = draft_worker.draft_runner
        rows = runner.req_to_token_pool.size
        self.backend = DraftExtendAttentionBackend(runner.req_to_token_pool.req_to_token)
        # rows for every draft token of every request: releases whose draft-extend runner
        # outputs one row per draft token (0.5.17) need that many, later ones fewer
        width = max(1, int(getattr(draft_worker, "speculative_num_draft_tokens", 1) or 1))
        self.hidden_buffer = torch.zeros((rows * width, eagle_models.HIDDEN),
                                         dtype=torch.float32, device="cuda")
        # the draft runner's fields the graph runner reads (the fake runner refuses others)
        runner.graph_shared_output = GraphSharedOutput(device=torch.device("cuda"),
                                                       max_rows=rows * width)
        runner.model = _DraftModel(self)
        runner.device_timer = None
        runner.hisparse_coordinator = None
        runner.gpu_id = 0
        runner.tp_size = get_parallel().tp_size  # the one-rank groups (read by 0.5.21's runner)
        runner.server_args = graph_server_args(runner.server_args, config)
        runner._kernel_warmed_up = True  # no kernels to autotune
        # flashinfer's draft autotune: done (no flashinfer kernels here)
        runner._flashinfer_spec_draft_autotuned_phases = {
            f"{RUNNER_MODULE}.EAGLEDraftExtendCudaGraphRunner"}
        runner.capture_head_hooks, runner.capture_tail_hooks = [], []
        capture_stream = torch.cuda.Stream()
        capture_stream.name = "graph_capture_stream"
        pool.set_global_graph_memory_pool(None)
        one_rank = StrictStub("tp_group", barrier=lambda: None, world_size=1, rank_in_group=0)
        with graph_platform(), get_parallel().override(tp_group=one_rank):
            self.runner = EAGLEDraftExtendCudaGraphRunner(
                draft_worker, draft_extend_attn_backend=self.backend)
        draft_worker.cuda_graph_runner_for_draft_extend = self.runner


def attach(scheduler: Any, batch_sizes: tuple[int, ...]) -> DraftExtendGraphs:
    """Give the EAGLE draft worker SGLang's draft-extend graph runner (captured now, at
    startup, as ``EagleDraftWorker._capture_cuda_graphs`` does)."""
    return DraftExtendGraphs(scheduler.draft_worker.draft_worker, batch_sizes)


@dataclass(frozen=True, slots=True)
class CudaGraphDraftExtend(Feature):
    """The EAGLE draft extend replayed by SGLang's draft-extend graph runner, capturing
    ``sizes`` at startup."""

    keys: ClassVar[tuple[str, ...]] = ("cuda_graph",)
    options: ClassVar[tuple[str, ...]] = ("--disable-cuda-graph", "--cuda-graph-bs")

    sizes: tuple[int, ...] = (1, 2)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"cuda_graph": "verify_and_draft_extend"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.DRAFT_EXTEND_GRAPHS]

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        attach(scheduler, self.sizes)
