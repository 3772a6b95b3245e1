"""SGLang's own ``MultiLayerEagleWorkerV2`` and ``MultiLayerEagleDraftWorker`` for the
driven loop (multi-layer EAGLE: an MTP model's draft layers, one model runner per draft
step; ``--enable-multi-layer-eagle``, which ``SpeculativeAlgorithm`` answers with this
worker in ``spec_info.py``).

Both are made by SGLang's own ``__init__``, as :mod:`.eagle` makes the single-layer worker:
the draft ``TpModelWorker`` they would load (``is_multi_layer_eagle=True``, one model runner
per step: ``model_runner_list``) is swapped, for the construction, for a stand-in holding one
``FakeStepRunner`` (``stand_ins/multi_layer_eagle_models.py``) per draft step; the target is
the ``FakeTargetWorker`` of ``stand_ins/eagle_models.py``. ``init_lm_head`` (the target's
embedding and LM head shared, weights) is a no-op. What ``init_attention_backend`` builds,
one draft-extend backend per step, is set to planning stand-ins (``planning_backend``), and
no graph runners: an eager draft extend, as a server with ``--disable-cuda-graph`` or
``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH`` runs it.

From there SGLang's code runs as released: ``forward_batch_generation`` (prefill: target,
``on_publish``, ``_draft_extend_for_prefill``'s per-step forwards with ``rotate_input_ids``;
decode: ``draft`` (the chain read from the previous draft extend's top-k, no draft forward),
``_draft_extend_plan_for_decode``, ``run_eagle_verify``, ``on_publish``,
``_draft_extend_for_decode`` with its plan-stream block), the boundary-KV state (off: the
pool is not a hybrid one; on with :class:`.boundary_kv.BoundaryKvWindow`) and the scheduler's
spec-v2 relay.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features import eagle
from overlap_harness.engines.sglang.features.boundary_kv import BoundaryKvWindow
from overlap_harness.engines.sglang.features.eagle import Eagle
from overlap_harness.engines.sglang.scheduler_build import DEVICE, PoolSizes
from overlap_harness.engines.sglang.stand_ins import (
    eagle_kernels,
    eagle_models,
    multi_layer_eagle_models,
)
from overlap_harness.engines.sglang.stand_ins.model_worker import _ngram_manager

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

WORKER_MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
#: the contexts that scope the draft model's build to its parallel groups (none on one rank)
BUILD_SCOPES = ("draft_pp_context", "draft_tp_context", "speculative_moe_backend_context",
                "speculative_moe_a2a_backend_context", "draft_model_build_scope")


@dataclass(frozen=True, slots=True)
class MultiLayerEagle(Eagle):
    """SGLang's multi-layer EAGLE v2 worker (``--enable-multi-layer-eagle``: an MTP model's
    draft layers, one runner per step) in place of the single-layer one: EAGLE's options, the
    key ``multi_layer_eagle``, and ``boundary_kv=off`` unless the variant has the window
    (:class:`.boundary_kv.BoundaryKvWindow`). SGLang asks ``num_draft_tokens == num_steps + 1``."""

    keys: ClassVar[tuple[str, ...]] = ("multi_layer_eagle", *Eagle.keys, "boundary_kv")
    options: ClassVar[tuple[str, ...]] = ("--enable-multi-layer-eagle", *Eagle.options)

    def configuration(self, variant: Variant) -> dict[str, str]:
        # the boundary-KV window off unless the variant has it (its feature then says on)
        window = {} if variant.has(BoundaryKvWindow) else {"boundary_kv": "off"}
        return {"multi_layer_eagle": "on", **Eagle.configuration(self, variant), **window}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.MULTI_LAYER_EAGLE if need is rf.EAGLE_V2 else need
                for need in Eagle.release_needs(self, variant)]

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (eagle_kernels.declare, multi_layer_eagle_models.declare)

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        Eagle.server_options(self, options, variant)
        options.update(enable_multi_layer_eagle=True)

    def spec_workers(self, variant: Variant) -> Callable[[Any, Any], None]:
        return lambda scheduler, sizes: build_workers(scheduler, sizes, self,
                                                      variant.feature(BoundaryKvWindow))


def _step_runner(step: int, pool: Any, allocator: Any, sizes: PoolSizes, config: Eagle,
                 scheduler: Any) -> multi_layer_eagle_models.FakeStepRunner:
    """Draft step ``step``'s model runner: the fields SGLang's multi-layer path reads."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = multi_layer_eagle_models.FakeStepRunner(
        step, pool, sizes.kv_tokens, model_config=eagle._model_config(
            f"draft_model_config[{step}]"),
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"), canary_manager=None,
        shared_read_done_event=None, war_fastpath_read_done_event=None, device=DEVICE,
        is_draft_worker=True,
        attn_backend=eagle._attn_backend(f"draft_extend_attn_backend[{step}]", pool,
                                               config.needs_cpu_seq_lens),
        token_to_kv_pool_allocator=allocator, lora_manager=None, topk=config.topk,
        num_steps=config.num_steps, prefill_attention_backend_str="flashinfer",
        ngram_embedding_manager=_ngram_manager(pool),
        tp_group=StrictStub(f"draft_tp_group[{step}]", world_size=1, rank_in_group=0,
                            is_first_rank=True, is_last_rank=True, barrier=lambda: None),
        **eagle._translator(pool, allocator, is_draft_worker=True))
    runner.req_to_token_pool = pool
    runner.token_to_kv_pool = allocator.get_kvcache()
    runner.server_args = scheduler.server_args
    runner.dcp_size = runner.attn_dcp_size = 1
    if hasattr(scheduler, "ps"):
        runner.ps = scheduler.ps
    return runner


def build_workers(scheduler: Any, sizes: PoolSizes, config: Eagle,
                  window: BoundaryKvWindow | None = None) -> None:
    """Give ``scheduler`` SGLang's multi-layer EAGLE worker over the fake target and the
    fake per-step draft runners (its ``spec_algorithm``, ``tp_worker``, ``draft_worker``,
    ``model_worker``); with the boundary-KV ``window``, the worker's ``alloc_memory_pool`` is
    given the pool it asks for (:meth:`.boundary_kv.BoundaryKvWindow.worker_pool`)."""
    import importlib

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    module = importlib.import_module(WORKER_MODULE)
    pool, allocator = scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator
    target = eagle_models.FakeTargetWorker(pool, allocator, sizes.kv_tokens,
                                           eagle._target_runner(pool, allocator, config,
                                                                      sizes))
    target.random_seed = 0
    allocator.get_kvcache().move_kv_cache = target.move_kv_cache
    runners = [_step_runner(step, pool, allocator, sizes, config, scheduler)
               for step in range(config.num_steps)]
    target.model_runner.server_args = scheduler.server_args
    target.model_runner.dcp_size = target.model_runner.attn_dcp_size = 1
    if hasattr(scheduler, "ps"):
        target.model_runner.ps = scheduler.ps
    draft_tp_worker = StrictStub("multi_layer_draft_tp_worker", model_runner_list=runners,
                                 model_runner=runners[0],
                                 model_config=runners[0].model_config,
                                 alloc_memory_pool=eagle._noop)

    def draft_tp_worker_factory(**kwargs: Any) -> StrictStub:
        if not kwargs.get("is_multi_layer_eagle", True):
            raise TypeError("the multi-layer draft worker asked a single-layer TpModelWorker")
        return draft_tp_worker

    eagle._groups()
    scopes = [(module, name, eagle._no_scope) for name in BUILD_SCOPES
              if hasattr(module, name)]
    with attributes_set([(module, "TpModelWorker", draft_tp_worker_factory), *scopes]):
        given = {"server_args": scheduler.server_args, "gpu_id": 0, "nccl_port": 0,
                 "target_worker": target, "ps": getattr(scheduler, "ps", None)}
        parameters = inspect.signature(module.MultiLayerEagleWorkerV2).parameters
        worker = module.MultiLayerEagleWorkerV2(**{name: given[name] for name in parameters})
    with attributes_set([(module.MultiLayerEagleDraftWorker, "init_lm_head",
                          eagle._noop)]):
        worker_pool = pool if window is None else window.worker_pool(pool, target, runners)
        worker.alloc_memory_pool(memory_pool_config=None, req_to_token_pool=worker_pool,
                                 token_to_kv_pool_allocator=allocator)
    draft = worker.draft_worker
    # init_attention_backend's result: one draft-extend backend per step, each its runner's
    draft.draft_extend_attn_backend_list = [runner.attn_backend for runner in runners]
    draft.cuda_graph_runner = draft.cuda_graph_runner_for_draft_extend = None
    scheduler.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
    scheduler.tp_worker = target
    scheduler.draft_worker = scheduler.model_worker = worker

