"""The multi-layer EAGLE draft extend under SGLang's own draft-extend CUDA-graph runners.

With CUDA graphs on, SGLang's ``MultiLayerEagleDraftWorker._capture_cuda_graphs`` picks the
runner: ``OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner`` (every draft step and
the ``rotate_input_ids`` between them captured in one graph per batch size) when
``SGLANG_ENABLE_SINGLE_CG_DRAFT`` is on (its default) and every step's backend rebuilds or
stages its metadata, else ``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner`` (one graph
per step over one shared buffer set, the worker rotating between replays). The decode's
``_draft_extend_for_decode`` then builds the ``ForwardBatch`` in its plan-stream block
(``prepare_for_draft_extend`` asks the runner's ``can_run_graph`` and plans no metadata),
and on the forward stream the runner's ``prepare`` fills the shared static buffers
(``fill_draft_extend_prepare_buffers``) and each ``replay(step)`` replays.

With the boundary-KV window on (:mod:`.boundary_kv`, composed with this feature), both
runners capture each request widened by the window's front rows (``captured_req_width``:
``resolve_num_tokens_per_req(phase="draft_extend") + num_front_tokens``, the worker's
``draft_extend_num_front_tokens``) and ``can_run_graph`` replays a batch only at that width;
the worker's widened draft extend says it (``num_tokens_per_req``), so every decode's window
replays, its slots and positions copied into the static buffers by ``prepare``.

SGLang's: ``_capture_cuda_graphs`` (the choice of runner, called here as the worker's
``init_cuda_graphs`` calls it at startup), both runner classes, their ``__init__``, buffers,
capture on the FULL graph backend, ``can_run_graph``, ``prepare``, ``replay`` and the
worker's per-step loop. The harness's (``stand_ins/multi_layer_eagle_graph_model.py``): each
step's backend (eager planning and in-graph metadata prep), each step's draft layer inside
the graph and the declared ``fill_draft_extend_prepare_buffers``. Found by feature: a release
without the runner module's classes lists the variant as not applicable
(``release_features.MULTI_LAYER_DRAFT_EXTEND_GRAPHS``, ``MULTI_LAYER_ONE_GRAPH_DRAFT``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature, on_off
from overlap_harness.engines.sglang.features.decode_graph import (
    graph_platform,
    graph_server_args,
    publish_decode_graphs,
)
from overlap_harness.engines.sglang.stand_ins import multi_layer_eagle_graph_model as graph_model

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

WORKER_MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"


def _no_gpu_memory(*args: Any, **kwargs: Any) -> float:
    """``get_available_gpu_memory``: only logged and summed around the capture."""
    return 0.0


def _prepare_step_runner(runner: Any, server_args: Any, config: Any, max_tokens: int
                         ) -> graph_model.StepGraphBackend:
    """Step runner ``runner``'s backend and model for the graphs, and the fields SGLang's
    graph runner reads of a model runner (the fake runner refuses others)."""
    from sglang.srt.runtime_context import get_parallel

    backend = graph_model.StepGraphBackend(runner.attn_backend,
                                           runner.req_to_token_pool.req_to_token)
    runner.attn_backend = backend  # SGLang's init_attention_backend: the runner's own
    runner.model = graph_model.StepGraphModel(runner, backend, max_tokens)
    runner.dtype = torch.float32
    runner.device_timer = None
    runner.hisparse_coordinator = None
    runner.gpu_id = 0
    runner.tp_size = get_parallel().tp_size  # the one-rank groups (read by 0.5.21's runner)
    runner.server_args = graph_server_args(server_args, config)
    runner._kernel_warmed_up = True  # no kernels to autotune
    # flashinfer's draft autotune: done (no flashinfer kernels here)
    runner._flashinfer_spec_draft_autotuned_phases = {
        f"{graph_model.RUNNER_MODULE}.MultiLayerEagleDraftExtendCudaGraphRunner"}
    runner.capture_head_hooks, runner.capture_tail_hooks = [], []
    return backend


def captured_request_width(draft: Any) -> int:
    """The tokens per request SGLang's draft-extend graph runner captures and replays for
    the multi-layer draft worker ``draft``: the chain's ``num_steps + 1`` rows, widened by
    the boundary-KV window's front rows where the worker turned the window on (the runner's
    ``captured_req_width``: ``resolve_num_tokens_per_req(phase="draft_extend") +
    draft_extend_num_front_tokens``; a worker without the window has no front rows)."""
    return draft.speculative_num_steps + 1 + getattr(draft, "draft_extend_num_front_tokens", 0)


def attach(scheduler: Any, batch_sizes: tuple[int, ...]) -> Any:
    """Give the multi-layer draft worker SGLang's draft-extend graph runner, chosen and
    captured by its own ``_capture_cuda_graphs`` now, at startup. Returns the runner."""
    from sglang.srt.model_executor.runner_utils import pool
    from sglang.srt.runtime_context import get_parallel

    draft = scheduler.draft_worker.draft_worker
    config = publish_decode_graphs(batch_sizes)
    rows = draft.req_to_token_pool.size
    max_tokens = rows * captured_request_width(draft)
    draft.draft_extend_attn_backend_list = [
        _prepare_step_runner(runner, scheduler.server_args, config, max_tokens)
        for runner in draft.draft_runner_list]
    module = importlib.import_module(WORKER_MODULE)
    runner_module = importlib.import_module(graph_model.RUNNER_MODULE)
    pool.set_global_graph_memory_pool(None)  # this run's graph pool, made in its watch
    one_rank = StrictStub("tp_group", barrier=lambda: None, world_size=1, rank_in_group=0)
    # the worker's platform flags: a CUDA rank (the CPU mode's platform says CPU)
    flags = [(module, name, False) for name in ("_is_cpu", "_is_npu") if hasattr(module, name)]
    memory = [(m, "get_available_gpu_memory", _no_gpu_memory) for m in (module, runner_module)
              if hasattr(m, "get_available_gpu_memory")]
    with graph_platform(), get_parallel().override(tp_group=one_rank), \
            attributes_set(flags + memory):
        draft._capture_cuda_graphs()
    if draft.cuda_graph_runner_for_draft_extend is None:
        raise RuntimeError("the multi-layer draft worker captured no draft-extend graph")
    return draft.cuda_graph_runner_for_draft_extend


@contextmanager
def _single_graph(on: bool) -> Iterator[None]:
    """``SGLANG_ENABLE_SINGLE_CG_DRAFT`` as configured, draft-extend graphs not disabled."""
    from sglang.srt.environ import envs

    with envs.SGLANG_ENABLE_SINGLE_CG_DRAFT.override(on), \
            envs.SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH.override(False):
        yield


@dataclass(frozen=True, slots=True)
class CudaGraphMultiLayerDraftExtend(Feature):
    """The multi-layer EAGLE draft extend replayed by SGLang's draft-extend graph runner of
    its choice (``single_graph``: ``SGLANG_ENABLE_SINGLE_CG_DRAFT``, on by default: every step
    in one graph; off: one graph per step), capturing ``sizes`` at startup."""

    keys: ClassVar[tuple[str, ...]] = ("cuda_graph", "single_cg_draft")
    options: ClassVar[tuple[str, ...]] = ("--disable-cuda-graph", "--cuda-graph-bs",
                                          "SGLANG_ENABLE_SINGLE_CG_DRAFT",
                                          "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH")

    sizes: tuple[int, ...] = (1, 2)
    single_graph: bool = True

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"cuda_graph": "verify_and_draft_extend",
                "single_cg_draft": on_off(self.single_graph)}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.MULTI_LAYER_ONE_GRAPH_DRAFT if self.single_graph
                else rf.MULTI_LAYER_DRAFT_EXTEND_GRAPHS]

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (graph_model.declare,)

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return _single_graph(self.single_graph)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        attach(scheduler, self.sizes)
