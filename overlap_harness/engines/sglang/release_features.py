"""Which SGLang features a variant needs, and whether the loaded release has them.

A variant drives one path of SGLang's overlap loop; an older release may not have that path
yet (0.5.17 has no ``SharedReadEnds``, the attention backend's declaration of where its
shared reads end; 0.5.18 has no late-bound EAGLE tails for mixed chunked prefill). Such a
variant is not applicable to the release, with the reason: the feature, and the SGLang
module and name that carry it and that the release lacks. Everything is found by looking
at the loaded release (a module present, a name defined), never by its version string.
Which release features a variant needs follows from its features (each names its own:
:meth:`~.features.api.Feature.release_needs`), so a new variant is checked without being
listed here.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.variants import Variant

SCHEDULER = "sglang.srt.managers.scheduler"
OVERLAP_UTILS = "sglang.srt.managers.overlap_utils"


@dataclass(frozen=True, slots=True)
class Feature:
    """A release feature: what it is, in words, and the SGLang name that carries it
    (``module`` and a dotted ``name`` inside it; None: the module itself)."""

    what: str
    module: str
    name: str | None = None

    def where(self) -> str:
        """``module:name`` (the module alone when no name)."""
        return self.module if self.name is None else f"{self.module}:{self.name}"


OVERLAP_LOOP = Feature("the overlap event loop", SCHEDULER, "Scheduler.event_loop_overlap")
EAGLE_V2 = Feature("the EAGLE v2 worker (speculative decoding v2 under the overlap loop)",
                   "sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2")
MULTI_LAYER_EAGLE = Feature("the multi-layer EAGLE v2 worker (MTP models' draft layers, one "
                           "runner per step)",
                           "sglang.srt.speculative.multi_layer_eagle_worker_v2",
                           "MultiLayerEagleWorkerV2")
SEQ_LENS_D2H = Feature("FutureMap's D2H stream for host sequence lengths", OVERLAP_UTILS,
                       "FutureMap.resolve_seq_lens_cpu")
MIXED_SPEC_TAILS = Feature("mixed chunked prefill beside EAGLE decodes (FutureMap's "
                           "late-bound spec tails)", OVERLAP_UTILS,
                           "FutureMap.resolve_mixed_spec_tails")
DECODE_GRAPHS = Feature("the decode CUDA-graph runner",
                        "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                        "DecodeCudaGraphRunner")
POST_REPLAY_READS = Feature("attention backends whose shared reads end after the graph "
                            "replay (SharedReadEnds.POST_REPLAY)",
                            "sglang.srt.layers.attention.base_attn_backend",
                            "SharedReadEnds.POST_REPLAY")
DP_ATTENTION_SYNC = Feature("attention data parallelism's MLP sync between ranks",
                            "sglang.srt.managers.scheduler_components.dp_attn",
                            "MLPSyncBatchInfo")
VERIFY_GRAPH_LOAD = Feature("the EAGLE target verify staged into the decode CUDA-graph runner "
                            "(load_batch)",
                            "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                            "DecodeCudaGraphRunner.load_batch")
DRAFT_EXTEND_GRAPHS = Feature("the EAGLE draft-extend CUDA-graph runner",
                              "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
                              "EAGLEDraftExtendCudaGraphRunner")
MULTI_LAYER_BOUNDARY_KV = Feature(
    "the multi-layer EAGLE worker's boundary-KV window (SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX: "
    "draft extends widened by front rows from a per-request stash)",
    "sglang.srt.speculative.multi_layer_eagle_worker_v2",
    "MultiLayerEagleDraftWorker._init_boundary_kv_fix_state")
HYBRID_REQUEST_POOL = Feature("the request pool of hybrid (mamba / linear-attention) models",
                              "sglang.srt.mem_cache.memory_pool", "HybridReqToTokenPool")
MULTI_LAYER_DRAFT_EXTEND_GRAPHS = Feature(
    "the multi-layer EAGLE draft-extend CUDA-graph runner (one graph per draft step)",
    "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner",
    "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner")
MULTI_LAYER_ONE_GRAPH_DRAFT = Feature(
    "the multi-layer EAGLE draft extend's steps in one CUDA graph (SGLANG_ENABLE_SINGLE_CG_DRAFT)",
    "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner",
    "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner")
DELAYED_SAMPLE = Feature("the scheduler's delayed sampling (grammar batches without "
                         "speculation, SGLANG_ENABLE_DELAY_SAMPLE)", "sglang.srt.managers.utils",
                         "GenerationBatchResult.delay_sample_func")
HIP_BRANCHES = Feature("the overlap loop's HIP branches", SCHEDULER, "_is_hip")
DELAY_SAMPLE = Feature("delayed sampling of every non-prefill-only forward, switched on by "
                       "SGLANG_ENABLE_DELAY_SAMPLE (older releases delay only grammar batches)",
                       "sglang.srt.environ", "Envs.SGLANG_ENABLE_DELAY_SAMPLE")
EAGER_PREFILL_READ_DONE = Feature("the eager runner's prefill read-done fastpath (its extend "
                                  "publishes the event of a PRE_REPLAY backend)",
                                  "sglang.srt.model_executor.runner.eager_runner",
                                  "maybe_publish_prefill_shared_read_done")
DSPARK_CONFIDENCE_RELAY = Feature("FutureMap's confidence relay (DSpark's draft confidence to "
                                  "the host through a pinned ring)", OVERLAP_UTILS,
                                  "ConfidenceRelay.issue_ring_copy")
DSPARK_VERIFY_BUDGET = Feature("DSpark's verify planner preparing the verify budget from the "
                               "relayed confidence",
                               "sglang.srt.speculative.dspark_components.dspark_planner",
                               "DSparkVerifyPlanner.prepare_verify_budget")
DFLASH_DRAFT_INPUT = Feature("the DFlash-family spec-v2 draft input (its decode preparation)",
                             "sglang.srt.speculative.dflash_info_v2",
                             "DFlashDraftInputV2.prepare_for_decode")
UNIFIED_MEMORY = Feature("the unified memory pool's sub-pool allocator where the harness drives "
                         "it (older releases keep their MultiEndedAllocator in "
                         "mem_cache/multi_ended_allocator.py)",
                         "sglang.srt.mem_cache.allocator.unified_sub_pool",
                         "MultiEndedAllocator.set_inflight_forward")
UNIFIED_PAGE_COPY = Feature("the unified pool's page-copy kernel of compaction moves (the one "
                             "the harness declares; older releases move pages otherwise)",
                             "sglang.kernels.ops.kvcache.copy_pages", "copy_pages")
UNIFIED_SWA_POOLS = Feature("the unified memory pool of hybrid-SWA models",
                            "sglang.srt.mem_cache.unified_memory_pool", "init_unified_swa_pools")
RETRACT_HOOK = Feature("the retraction test hook (SGLANG_TEST_RETRACT)", SCHEDULER,
                       "TEST_RETRACT")


def required_features(variant: Variant) -> list[Feature]:
    """The release features ``variant`` drives: the overlap loop, then each of its features'
    (in the variant's feature order, each release feature once)."""
    features = [OVERLAP_LOOP]
    for feature in variant.features:
        features += [need for need in feature.release_needs(variant) if need not in features]
    return features


def lacks(feature: Feature) -> str | None:
    """Why the loaded release lacks ``feature`` (None when it has it): the module or the
    name that is not there."""
    if importlib.util.find_spec(feature.module) is None:
        return f"no module {feature.module}"
    value: object = importlib.import_module(feature.module)
    if feature.name is None:
        return None
    walked = feature.module
    for part in feature.name.split("."):
        if not hasattr(value, part):
            return f"{walked} has no {part}"
        value = getattr(value, part)
        walked = f"{walked}.{part}" if walked != feature.module else f"{walked}:{part}"
    return None


def not_applicable_reason(variant: Variant) -> str | None:
    """Why ``variant`` does not apply to the loaded release (None: it applies): each
    feature it needs that the release lacks, what it is and what is missing."""
    missing = [f"{feature.what}: {why}" for feature in required_features(variant)
               if (why := lacks(feature)) is not None]
    if not missing:
        return None
    return "the release lacks " + "; ".join(missing)
