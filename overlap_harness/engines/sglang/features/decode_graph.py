"""Decode under CUDA graphs: SGLang's own ``DecodeCudaGraphRunner``, with the model declared.

The runner is SGLang's class, built by its own ``__init__`` and run by its own methods:
``get_batch_sizes_to_capture`` (which batch sizes are captured), the static input buffers
(``DecodeInputBuffers`` and the slot registry with its padding policies), ``capture`` and
``capture_one_shape`` on ``FullCudaGraphBackend`` (two warm-up forwards, then
``torch.cuda.graph`` into the shared graph pool on the global capture stream),
``can_run_graph``, ``load_batch`` (pad to the next captured size, copy the batch into the
static buffers on the forward stream, the out-of-graph attention prep), ``execute`` (replay,
publish the read-done event, slice the outputs out of the static logits buffer), and the
read-done event itself (``_record_in_graph_metadata_prep_done`` records an external event
*inside* the graph; ``_publish_read_done`` hands it, or a fresh event, to the scheduler).

What is the harness's (the model is not loaded, and these need weights, NCCL or kernels):

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
* the model runner (:class:`GraphModelRunner`) lists the fields the runner reads; the
  parallel groups are one rank (``graph_capture`` enters the capture stream after it waits on
  the current one, as SGLang's TP group does, with no collective to capture).
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import tqdm

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins import graph_kernels
from overlap_harness.engines.sglang.stand_ins.graph_attention import (
    PrivateIndexBackend,
    _kernel_values,
    _static_rows,
    copy_row_kv_indices,
)
from overlap_harness.engines.sglang.stand_ins.model_worker import ReadDoneEventNames
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
READ_EVENT_MODULE = "sglang.srt.model_executor.runner_utils.shared_read_event"
INPUT_BUFFERS_MODULE = "sglang.srt.model_executor.input_buffers"


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


@contextmanager
def _one_rank_capture(stream: Any = None) -> Iterator[Any]:
    """``parallel_state.graph_capture`` of one rank: the capture stream waits on the current
    one and becomes current (what SGLang's TP group does; there is no collective)."""
    current = torch.cuda.current_stream()
    if stream is None:
        stream = torch.cuda.Stream()
    if current != stream:
        stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield SimpleNamespace(stream=stream)


#: the capture's progress bar, silent (it writes to stderr on every run)
_QUIET_TQDM = SimpleNamespace(tqdm=functools.partial(tqdm.tqdm, disable=True))


@contextmanager
def _no_gc_tuning(enable_cudagraph_gc: bool) -> Iterator[None]:
    """``freeze_gc``: Python's garbage collection around the capture (two full collections
    of SGLang's heap, 2 s of CPU here), nothing the streams see."""
    yield


def _no_gpu_memory(*args: Any, **kwargs: Any) -> float:
    """``get_available_gpu_memory``: only logged around the capture."""
    return 0.0


@contextmanager
def graph_platform() -> Iterator[None]:
    """The runner's module-level helpers for one CUDA rank: SGLang's ``is_cuda()`` for the
    external read-done event, the one-rank ``graph_capture``, no memory probe, no garbage
    collection tuning, a fresh shared-buffer pool, a silent progress bar."""
    runner_module = sys.modules[RUNNER_MODULE]
    buffers_module = sys.modules[INPUT_BUFFERS_MODULE]
    # SGLang's process-wide pool of shared static buffers: empty for this run, so that the
    # buffers are allocated inside this run's watch (a previous run's are unknown to it)
    patches = [(buffers_module, "_forward_input_buffer_pool", {}),
               (runner_module, "graph_capture", _one_rank_capture),
               (runner_module, "get_available_gpu_memory", _no_gpu_memory),
               (runner_module, "freeze_gc", _no_gc_tuning),
               (runner_module, "tqdm", _QUIET_TQDM)]
    # the external read-done event's CUDA check, in releases that have that module (0.5.17
    # records a plain event in the runner itself)
    if (event_module := sys.modules.get(READ_EVENT_MODULE)) is not None:
        patches.append((event_module, "is_cuda", lambda: True))
    with attributes_set(patches):
        yield


def publish_decode_graphs(batch_sizes: tuple[int, ...]) -> Any:
    """Decode CUDA graphs on in the published configuration (what ``--cuda-graph-config``
    gives; the CPU resolution turns them off): the FULL backend for ``batch_sizes``, prefill
    graphs off. SGLang's ``get_batch_sizes_to_capture`` then clamps the list to the pool.
    Returns the config."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, CudaGraphConfig, PhaseConfig
    from sglang.srt.runtime_context import get_context

    config = CudaGraphConfig(decode=PhaseConfig(backend=Backend.FULL, bs=list(batch_sizes)),
                             prefill=PhaseConfig(backend=Backend.DISABLED))
    get_context().override("harness.graph_decode", cuda_graph_config=config)
    return config


def graph_server_args(server_args: Any, config: Any) -> Any:
    """The server arguments a graph runner is given: ``server_args`` itself, or, for releases
    whose runner reads the graph option from its server arguments (0.5.17) rather than the
    published configuration, a copy holding ``config`` (later releases' resolved arguments
    refuse the assignment: they read the published one)."""
    if getattr(server_args, "cuda_graph_config", None) is not None:
        return server_args
    runner_args = copy.copy(server_args)
    try:
        runner_args.cuda_graph_config = config
    except AttributeError:
        return server_args
    return runner_args


def build_runner(model_runner: GraphModelRunner) -> Any:
    """SGLang's ``DecodeCudaGraphRunner`` for ``model_runner``: its ``__init__`` allocates
    the static buffers and captures one graph per batch size (inside :func:`graph_platform`
    and a recorder watch)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )
    from sglang.srt.model_executor.runner_utils import pool
    from sglang.srt.runtime_context import get_parallel, set_stream

    # the process-wide capture stream and graph pool, made in this watch (SGLang caches them
    # for the process; the platform resolved here is the CPU, whose Stream is not CUDA's)
    capture_stream = torch.cuda.Stream()
    capture_stream.name = "graph_capture_stream"
    if hasattr(pool, "_CAPTURE_STREAM_NAME"):  # older releases: graph_capture's own stream
        set_stream(pool._CAPTURE_STREAM_NAME, capture_stream)
    pool.set_global_graph_memory_pool(None)
    # the capture's barrier between warm-up forwards: one rank has no one to wait for
    one_rank = StrictStub("tp_group", barrier=_no_barrier, world_size=1, rank_in_group=0)
    model_runner.tp_group = one_rank  # where older releases' graph backends read it
    with get_parallel().override(tp_group=one_rank):
        return DecodeCudaGraphRunner(model_runner)


def _no_barrier() -> None:
    """``tp_group.barrier()`` of a group of one."""


def _sample_accesses(result: torch.Tensor, logits: torch.Tensor) -> list[DeclaredAccess]:
    return reads(logits) + writes(result)


@declared(_sample_accesses, name="sampler")
def _sample(logits: torch.Tensor) -> torch.Tensor:
    """Greedy sampling of the replay's logits rows (a view of the static logits buffer) into
    a fresh token tensor, on the forward stream after the replay."""
    with _kernel_values():
        return logits.argmax(dim=-1).to(torch.int64)


class DecodeGraphs:
    """The worker's decode path under CUDA graphs: SGLang's runner, built (and its graphs
    captured) at startup; each decode batch it can run is a ``ForwardBatch`` made by SGLang's
    ``ForwardBatch.init_new`` and replayed by the runner's ``execute``, then sampled."""

    def __init__(self, worker: Any, server_args: Any, batch_sizes: tuple[int, ...], *,
                 post_replay: bool = False, pre_replay: bool = False,
                 parallel_state: Any = None) -> None:
        server_args = graph_server_args(server_args, publish_decode_graphs(batch_sizes))
        fake = worker.model_runner
        self.model_runner = GraphModelRunner(
            worker.req_to_token_pool, fake.token_to_kv_pool_allocator, worker.kv_buffer,
            fake.ngram_embedding_manager, server_args, post_replay=post_replay,
            pre_replay=pre_replay)
        if parallel_state is not None:  # releases whose runners keep the scheduler's
            self.model_runner.ps = parallel_state
        with graph_platform():
            self.runner = build_runner(self.model_runner)
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


def attach(scheduler: Any, server_args: Any, batch_sizes: tuple[int, ...], *,
           post_replay: bool = False, pre_replay: bool = False) -> DecodeGraphs:
    """Give the scheduler's fake worker SGLang's decode graph runner (captured now, at
    startup, as ``ModelRunner.init_device_graphs`` does before the loop starts)."""
    worker = scheduler.model_worker
    graphs = DecodeGraphs(worker, server_args, batch_sizes, post_replay=post_replay,
                          pre_replay=pre_replay, parallel_state=getattr(scheduler, "ps", None))
    worker.decode_graphs = graphs
    return graphs


class ReadsEnd(StrEnum):
    """Where the graph's attention backend declares its shared ``req_to_token`` reads end
    (SGLang's ``SharedReadEnds``): inside the replay (the runner publishes the event recorded
    in the graph), after it (a fresh event after the replay), or before it (the decode
    metadata prepared out of the graph)."""

    IN_REPLAY = "in_replay"
    POST_REPLAY = "post_replay"
    PRE_REPLAY = "pre_replay"


@dataclass(frozen=True, slots=True)
class CudaGraphDecode(Feature):
    """Decode batches replayed by SGLang's decode CUDA-graph runner, capturing ``sizes`` at
    startup, its attention backend's reads ending where ``reads_end`` says."""

    keys: ClassVar[tuple[str, ...]] = ("cuda_graph", "attention_reads_end")
    options: ClassVar[tuple[str, ...]] = ("--disable-cuda-graph", "--cuda-graph-bs",
                                          "--attention-backend (its SharedReadEnds)")
    fake_runner: ClassVar[bool] = False  # the runner is SGLang's

    sizes: tuple[int, ...] = (1, 2, 4, 8)
    reads_end: ReadsEnd = ReadsEnd.IN_REPLAY

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"cuda_graph": "decode", "attention_reads_end": self.reads_end.value}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.DECODE_GRAPHS] + ([rf.POST_REPLAY_READS]
                                     if self.reads_end is ReadsEnd.POST_REPLAY else [])

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (graph_kernels.declare,)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        attach(scheduler, server_args, self.sizes,
               post_replay=self.reads_end is ReadsEnd.POST_REPLAY,
               pre_replay=self.reads_end is ReadsEnd.PRE_REPLAY)
