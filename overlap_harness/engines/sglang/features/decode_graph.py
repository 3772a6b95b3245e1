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

What is the harness's (the model is not loaded, and these need weights, NCCL or kernels) is
in :mod:`~overlap_harness.engines.sglang.stand_ins.graph_model`: the declared attention
backend, the model body inside the graph, the model runner's fields and the sampler.
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
from overlap_harness.engines.sglang.stand_ins.graph_model import GraphForwards, GraphModelRunner

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
READ_EVENT_MODULE = "sglang.srt.model_executor.runner_utils.shared_read_event"
INPUT_BUFFERS_MODULE = "sglang.srt.model_executor.input_buffers"


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


def build_forwards(worker: Any, server_args: Any, batch_sizes: tuple[int, ...], *,
                   post_replay: bool = False, pre_replay: bool = False,
                   parallel_state: Any = None) -> GraphForwards:
    """The worker's decode path under CUDA graphs: SGLang's runner, built (and its graphs
    captured) now, at startup, over the harness's model runner
    (:class:`~overlap_harness.engines.sglang.stand_ins.graph_model.GraphForwards` runs it)."""
    server_args = graph_server_args(server_args, publish_decode_graphs(batch_sizes))
    fake = worker.model_runner
    model_runner = GraphModelRunner(
        worker.req_to_token_pool, fake.token_to_kv_pool_allocator, worker.kv_buffer,
        fake.ngram_embedding_manager, server_args, post_replay=post_replay,
        pre_replay=pre_replay)
    if parallel_state is not None:  # releases whose runners keep the scheduler's
        model_runner.ps = parallel_state
    with graph_platform():
        runner = build_runner(model_runner)
    return GraphForwards(model_runner, runner)


def attach(scheduler: Any, server_args: Any, batch_sizes: tuple[int, ...], *,
           post_replay: bool = False, pre_replay: bool = False) -> GraphForwards:
    """Give the scheduler's fake worker SGLang's decode graph runner (captured now, at
    startup, as ``ModelRunner.init_device_graphs`` does before the loop starts)."""
    worker = scheduler.model_worker
    graphs = build_forwards(worker, server_args, batch_sizes, post_replay=post_replay,
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
