"""SGLang's own ``EAGLEWorkerV2`` and ``EagleDraftWorker`` for the driven loop.

Both are made by SGLang's own ``__init__``: the one thing they build that needs weights, the
draft ``TpModelWorker``, is swapped (for the length of the construction) for a stand-in
holding :class:`~overlap_harness.engines.sglang.stand_ins.eagle_models.FakeDraftRunner`; the target
worker is :class:`~overlap_harness.engines.sglang.stand_ins.eagle_models.FakeTargetWorker`. What
``init_attention_backend`` and ``_capture_cuda_graphs`` would build (attention backends of a
real model, CUDA graphs) is set to what a server without CUDA graphs has: strict stand-ins for
the backends, whose metadata planning is declared
(:func:`~overlap_harness.engines.sglang.stand_ins.eagle_models.planning_backend`), and no graph
runners.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature, on_off
from overlap_harness.engines.sglang.features.chunked_prefill import ChunkedPrefill
from overlap_harness.engines.sglang.features.hip import Hip
from overlap_harness.engines.sglang.scheduler_build import (
    DEVICE,
    PoolSizes,
    hold_for_run,
    override_for_run,
)
from overlap_harness.engines.sglang.stand_ins import eagle_kernels, eagle_models
from overlap_harness.engines.sglang.stand_ins.model_worker import _ngram_manager

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

MAX_CONTEXT = 64
TRANSLATOR_MODULE = "sglang.srt.mem_cache.kv_index_translator"

#: spec-v2 modules whose import-time platform flags choose branches (beside the loop's own,
#: which ``environment.cuda_selected`` switches)
SPEC_FLAGGED_MODULES = (
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.speculative.spec_utils",
    "sglang.kernels.ops.speculative.cache_locs",
    "sglang.kernels.ops.speculative.spec_tree",
)


@dataclass(frozen=True, slots=True)
class Eagle(Feature):
    """SGLang's single-layer EAGLE v2 worker (``--speculative-algorithm EAGLE``, spec v2
    under the overlap loop), its options as SGLang's server arguments and switches. Its CUDA
    graphs are features of their own (:class:`.eagle_verify_graph.VerifyGraph`,
    :class:`.draft_extend_graph.DraftExtendGraph`)."""

    keys: ClassVar[tuple[str, ...]] = ("speculative", "eagle_topk", "plan_stream",
                                       "cpu_seq_lens")
    options: ClassVar[tuple[str, ...]] = (
        "--speculative-algorithm EAGLE", "--speculative-eagle-topk",
        "--speculative-num-steps", "--speculative-num-draft-tokens",
        "SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "the attention backend's needs_cpu_seq_lens")
    speculative: ClassVar[bool] = True

    topk: int = 1
    num_steps: int = 3
    num_draft_tokens: int = 4
    plan_stream: bool = True  # SGLANG_ENABLE_OVERLAP_PLAN_STREAM
    needs_cpu_seq_lens: bool = False  # what the attention backends declare

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"speculative": "eagle", "eagle_topk": str(self.topk),
                "plan_stream": on_off(self.plan_stream),
                "cpu_seq_lens": on_off(self.needs_cpu_seq_lens)}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        needs = [rf.EAGLE_V2]
        if self.needs_cpu_seq_lens:
            needs.append(rf.SEQ_LENS_D2H)
        chunked = variant.feature(ChunkedPrefill)
        if chunked is not None and chunked.mixed:
            needs.append(rf.MIXED_SPEC_TAILS)
        return needs

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (eagle_kernels.declare,)

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        options.update(device=DEVICE, disable_cuda_graph=True, speculative_algorithm="EAGLE",
                       speculative_eagle_topk=self.topk,
                       speculative_num_steps=self.num_steps,
                       speculative_num_draft_tokens=self.num_draft_tokens)

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return selected(self, hip=variant.has(Hip))

    def spec_workers(self, variant: Variant) -> Callable[[Any, Any], None]:
        return lambda scheduler, sizes: build_workers(scheduler, sizes, self)


def _attn_backend(name: str, pool: Any, needs_cpu_seq_lens: bool, verify_mask: Any = None
                  ) -> StrictStub:
    """An attention backend's fields the spec path reads (FlashAttention-3-like: a target
    verify mask owned by the backend, no Triton extend block size); its metadata planning is
    declared (:func:`.stand_ins.eagle_models.planning_backend`)."""
    return eagle_models.planning_backend(
        name, pool.req_to_token, needs_cpu_seq_lens=needs_cpu_seq_lens,
        verify_mask=verify_mask, max_context_len=MAX_CONTEXT,
        update_verify_buffers_to_fill_after_draft=_noop, absent=("extend_attention_block_m",))


def _verify_mask(sizes: PoolSizes, config: Eagle) -> Any:
    """The target backend's verify mask, made by SGLang (read by attention only for trees)."""
    from sglang.srt.layers.attention.verify_mask import maybe_create_verify_mask

    return maybe_create_verify_mask(is_draft_runner=False, skip_prefill=False,
                                    max_bs=sizes.request_rows, max_context_len=MAX_CONTEXT,
                                    num_draft_tokens=config.num_draft_tokens, device=DEVICE,
                                    is_read=config.topk > 1)


def _noop(*args: Any, **kwargs: Any) -> None:
    """What launches nothing here: the base backend's post-draft verify-buffer update
    (FlashAttention-3 keeps the default: no buffers filled after draft), the draft worker's
    own pool allocation and the LM-head sharing (weights)."""


def _hf_config() -> Any:
    """A real (tiny) Llama checkpoint configuration: the type and fields SGLang's
    ``isinstance`` and ``getattr(config, name, default)`` probes of the architecture read."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=eagle_models.VOCAB, hidden_size=eagle_models.HIDDEN,
                       intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                       num_key_value_heads=1, max_position_embeddings=MAX_CONTEXT,
                       architectures=["LlamaForCausalLM"])


def _model_config(name: str) -> StrictStub:
    import torch

    return StrictStub(name, vocab_size=eagle_models.VOCAB, model_is_mrope=False,
                      spec_hidden_size=eagle_models.HIDDEN, dtype=torch.float32,
                      context_len=MAX_CONTEXT, hf_config=_hf_config(),
                      use_ngram_embedding=False, use_engram=False, is_multimodal=False,
                      requires_mm_token_modalities=False, linear_attn_registry_result=None)


def _translator(req_to_token_pool: Any, allocator: Any, *, is_draft_worker: bool
                ) -> dict[str, Any]:
    """The runner's ``kv_index_translator`` field: SGLang's ``KVIndexTranslator`` over a
    plain (non-unified) KV pool, the identity, as a model runner builds it; no field in a
    release without the translator (its runners have none)."""
    import importlib.util

    if importlib.util.find_spec(TRANSLATOR_MODULE) is None:
        return {}
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    # releases before the draft worker's own translator take no is_draft_worker
    role = ({"is_draft_worker": is_draft_worker} if "is_draft_worker" in
            inspect.signature(KVIndexTranslator).parameters else {})
    return {"kv_index_translator": KVIndexTranslator(req_to_token=req_to_token_pool.req_to_token,
                             token_to_kv_pool_allocator=allocator,
                             token_to_kv_pool=allocator.get_kvcache(), page_size=1,
                             device=DEVICE, **role)}


def _target_runner(req_to_token_pool: Any, allocator: Any, config: Eagle,
                   sizes: PoolSizes) -> StrictStub:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return StrictStub(
        "target_model_runner", attn_backend=_attn_backend(
            "target_attn_backend", req_to_token_pool, config.needs_cpu_seq_lens,
            _verify_mask(sizes, config)),
        shared_read_done_event=None, war_fastpath_read_done_event=None,
        req_to_token_pool=req_to_token_pool,
        token_to_kv_pool_allocator=allocator, model_config=_model_config("target_model_config"),
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"),
        spec_aux_config=StrictStub("spec_aux_config", draft_model_config=None),
        decode_cuda_graph_runner=None, watermark_state=None, canary_manager=None,
        prefill_aware_swa=False, ngram_embedding_manager=_ngram_manager(req_to_token_pool),
        **_translator(req_to_token_pool, allocator, is_draft_worker=False),
        is_draft_worker=False, device=DEVICE, lora_manager=None,
        prefill_attention_backend_str="flashinfer")


def _no_scope(*args: Any, **kwargs: Any) -> Any:
    """A draft-model build scope of a single-rank server without a model to build."""
    return nullcontext()


#: the parallel-state getters of the groups the EAGLE path asks for
GROUP_GETTERS = {"pp_group": "get_pp_group", "tp_group": "get_tp_group",
                 "attn_tp_group": "get_attention_tp_group"}
PARALLEL_STATE = "sglang.srt.distributed.parallel_state"


def _groups() -> None:
    """The parallel groups the EAGLE path asks for: one rank, the last pipeline stage,
    forced for the run in the parallel context (:func:`override_for_run`) and in the
    parallel-state globals a release's getters read instead (:func:`_module_global_groups`)."""
    one = {"world_size": 1, "is_last_rank": True, "is_first_rank": True, "rank_in_group": 0}
    groups = {name: StrictStub(name, **one) for name in GROUP_GETTERS}
    override_for_run(**groups)
    hold_for_run(attributes_set(_module_global_groups(groups)))


def _module_global_groups(groups: dict[str, StrictStub]) -> list[tuple[Any, str, Any]]:
    """Where a release's group getter returns a module global of SGLang's parallel state
    instead of the parallel context's field (0.5.19 and 0.5.20's ``get_pp_group`` reads
    ``_PP``, which only ``initialize_model_parallel`` sets; their ``EAGLEWorkerV2`` asks it
    whether this rank is the last pipeline stage), that global, unset, set to the same
    one-rank group for the run (0.5.18 and 0.5.19's HIP verify asks ``get_tp_group()`` too):
    (module, name, group) settings. Found by the getter's source (the unset global it ends by
    returning), never by version."""
    import importlib

    state = importlib.import_module(PARALLEL_STATE)
    settings = []
    for name, getter_name in GROUP_GETTERS.items():
        returned = _returned_global(getattr(state, getter_name, None))
        if returned is not None and hasattr(state, returned) and getattr(state, returned) is None:
            settings.append((state, returned, groups[name]))
    return settings


def _returned_global(getter: Any) -> str | None:
    """The module global a getter ends by returning (``return _PP``), from its source; None
    when it ends otherwise (``return get_parallel().pp_group``) or has no source."""
    import ast
    import textwrap

    if getter is None:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(getter))
    except (OSError, TypeError):
        return None
    body = ast.parse(source).body[0]
    last = body.body[-1] if isinstance(body, ast.FunctionDef) else None
    if isinstance(last, ast.Return) and isinstance(last.value, ast.Name):
        return last.value.id
    return None


def build_workers(scheduler: Any, sizes: PoolSizes, config: Eagle) -> None:
    """Give ``scheduler`` SGLang's EAGLE v2 worker over the fake target and draft forwards
    (its ``spec_algorithm``, ``tp_worker``, ``draft_worker``, ``model_worker``)."""
    from sglang.srt.speculative import eagle_worker_v2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool, allocator = scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator
    target = eagle_models.FakeTargetWorker(pool, allocator, sizes.kv_tokens,
                                           _target_runner(pool, allocator, config, sizes))
    target.random_seed = 0
    # the KV pool behind the shared allocator is the target's (the scheduler's stand-in)
    allocator.get_kvcache().move_kv_cache = target.move_kv_cache
    draft_runner = eagle_models.FakeDraftRunner(
        pool, sizes.kv_tokens, model_config=_model_config("draft_model_config"),
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE"), canary_manager=None,
        shared_read_done_event=None, war_fastpath_read_done_event=None, device=DEVICE,
        is_draft_worker=True,
        attn_backend=_attn_backend("draft_extend_attn_backend", pool,
                                   config.needs_cpu_seq_lens),
        token_to_kv_pool_allocator=allocator, lora_manager=None, topk=config.topk,
        num_steps=config.num_steps,
        prefill_attention_backend_str="flashinfer", ngram_embedding_manager=_ngram_manager(pool),
        # the one-rank group older releases' EAGLE worker reads of the draft runner
        tp_group=StrictStub("draft_tp_group", world_size=1, rank_in_group=0,
                            is_first_rank=True, is_last_rank=True,
                            barrier=lambda: None),  # one rank: a graph capture's barrier
        **_translator(pool, allocator, is_draft_worker=True))
    # what older releases' ForwardBatch.init_new reads of a runner: its server arguments
    # and the scheduler's ParallelState (later releases read the published configuration)
    for runner in (draft_runner, target.model_runner):
        runner.server_args = scheduler.server_args
        runner.dcp_size = runner.attn_dcp_size = 1  # no decode context parallelism
        if hasattr(scheduler, "ps"):
            runner.ps = scheduler.ps
    draft_tp_worker = StrictStub("draft_tp_worker", model_runner=draft_runner,
                                 alloc_memory_pool=_noop)

    def draft_tp_worker_factory(**kwargs: Any) -> StrictStub:
        return draft_tp_worker

    _groups()
    # the contexts that scope the draft model's build to its parallel groups (none here)
    scopes = [(eagle_worker_v2, name, _no_scope) for name in (
        "draft_pp_context", "draft_tp_context", "speculative_moe_backend_context",
        "speculative_moe_a2a_backend_context", "draft_model_build_scope")]
    with attributes_set([(eagle_worker_v2, "TpModelWorker", draft_tp_worker_factory),
                         *scopes]):
        # by name, as the scheduler's maybe_init_draft_worker gives them (older releases
        # take the scheduler's ParallelState too)
        given = {"server_args": scheduler.server_args, "gpu_id": 0, "nccl_port": 0,
                 "target_worker": target, "ps": getattr(scheduler, "ps", None)}
        parameters = inspect.signature(eagle_worker_v2.EAGLEWorkerV2).parameters
        worker = eagle_worker_v2.EAGLEWorkerV2(**{name: given[name] for name in parameters})
    # SGLang's own pool hand-over (Scheduler.init_memory_pool_and_cache); sharing the
    # target's embedding and LM head needs the models' weights
    with attributes_set([(eagle_worker_v2.EagleDraftWorker, "init_lm_head", _noop)]):
        worker.alloc_memory_pool(memory_pool_config=None, req_to_token_pool=pool,
                                 token_to_kv_pool_allocator=allocator)
    draft = worker.draft_worker
    draft.draft_attn_backend = _attn_backend("draft_attn_backend", pool,
                                             config.needs_cpu_seq_lens)
    draft.draft_attn_backend.attn_backends = [
        _attn_backend(f"draft_attn_backend[{i}]", pool, config.needs_cpu_seq_lens)
        for i in range(config.num_steps)]
    draft.draft_extend_attn_backend = draft_runner.attn_backend
    draft_runner.draft_attn_backend = draft.draft_attn_backend
    draft.cuda_graph_runner = draft.cuda_graph_runner_for_draft_extend = None
    scheduler.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
    scheduler.tp_worker = target
    scheduler.draft_worker = scheduler.model_worker = worker


@contextmanager
def selected(config: Eagle, *, hip: bool = False) -> Iterator[None]:
    """SGLang's plan stream as configured and the CUDA (or HIP) branches of the spec-v2
    helpers (:data:`SPEC_FLAGGED_MODULES`)."""
    from sglang.srt.environ import envs

    chosen = "_is_hip" if hip else "_is_cuda"
    flags = [(sys.modules[name], flag, flag == chosen) for name in SPEC_FLAGGED_MODULES
             for flag in ("_is_cuda", "_is_hip") if hasattr(sys.modules[name], flag)]
    with attributes_set(flags), envs.SGLANG_ENABLE_OVERLAP_PLAN_STREAM.override(
            config.plan_stream):
        yield
