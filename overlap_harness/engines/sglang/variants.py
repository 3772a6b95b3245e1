"""The variants of SGLang's overlap loop the adapter drives: arrivals and features.

A variant is a name, how many iterations run, the requests that arrive (iteration ->
(prompt length, max new tokens) each), the pools' sizes and a tuple of features: each one
SGLang switch or component with its own small configuration (:mod:`.features.api`: the
hooks by which a feature says what it needs of the run). Its SGLang configuration
(:mod:`.configurations`) and the release features it needs (:mod:`.release_features`) are
computed from its features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.boundary_kv import BoundaryKvWindow
from overlap_harness.engines.sglang.features.chunked_prefill import ChunkedPrefill
from overlap_harness.engines.sglang.features.decode_graph import CudaGraphDecode, ReadsEnd
from overlap_harness.engines.sglang.features.delay_sample import DelaySample
from overlap_harness.engines.sglang.features.dp_attention import DpAttention, PeerStep
from overlap_harness.engines.sglang.features.draft_extend_graph import CudaGraphDraftExtend
from overlap_harness.engines.sglang.features.dspark import Dspark
from overlap_harness.engines.sglang.features.eager_prefill import EagerPrefillReadDone
from overlap_harness.engines.sglang.features.eagle import Eagle
from overlap_harness.engines.sglang.features.eagle_verify_graph import CudaGraphVerify
from overlap_harness.engines.sglang.features.embedding import Embedding
from overlap_harness.engines.sglang.features.grammar import Grammar
from overlap_harness.engines.sglang.features.hip import Hip
from overlap_harness.engines.sglang.features.multi_layer_draft_extend_graph import (
    CudaGraphMultiLayerDraftExtend,
)
from overlap_harness.engines.sglang.features.multi_layer_eagle import MultiLayerEagle
from overlap_harness.engines.sglang.features.radix_cache import RadixCache
from overlap_harness.engines.sglang.features.retraction import Retraction
from overlap_harness.engines.sglang.features.unified_memory import UnifiedMemory
from overlap_harness.engines.sglang.scheduler_build import PoolSizes

#: every feature class, in the order the driver calls their hooks (a variant's features are
#: kept in this order, whatever order it lists them in): contexts entered, scheduler parts
#: attached and release features listed in this order. A new feature is added here.
FEATURE_ORDER: tuple[type[Feature], ...] = (
    Hip, Retraction, ChunkedPrefill, RadixCache, Embedding, DpAttention, CudaGraphDecode,
    EagerPrefillReadDone, DelaySample, UnifiedMemory, Eagle, MultiLayerEagle, BoundaryKvWindow,
    CudaGraphVerify, CudaGraphDraftExtend, CudaGraphMultiLayerDraftExtend, Dspark, Grammar)

F = TypeVar("F", bound=Feature)


@dataclass(frozen=True, slots=True)
class Variant:
    """One configuration of the real loop: its features (SGLang's switches and components
    it runs with), the requests that arrive (iteration -> (prompt length, max new tokens)
    each), how many iterations run, the pools' sizes."""

    name: str
    iterations: int
    arrivals: dict[int, tuple[tuple[int, int], ...]]
    features: tuple[Feature, ...] = ()
    pools: PoolSizes = field(default_factory=PoolSizes)

    def __post_init__(self) -> None:
        order = {cls: index for index, cls in enumerate(FEATURE_ORDER)}
        for feature in self.features:
            if type(feature) not in order:
                raise ValueError(f"variant {self.name}: {type(feature).__name__} is not in "
                                 "variants.FEATURE_ORDER (add the new feature there)")
        classes = [type(feature) for feature in self.features]
        if len(set(classes)) != len(classes):
            raise ValueError(f"variant {self.name}: a feature is listed twice")
        if sum(feature.speculative for feature in self.features) > 1:
            raise ValueError(f"variant {self.name}: two speculative workers")
        object.__setattr__(self, "features", tuple(sorted(
            self.features, key=lambda feature: order[type(feature)])))

    def feature(self, cls: type[F]) -> F | None:
        """The variant's feature of class ``cls`` (None: it has none)."""
        return next((f for f in self.features if type(f) is cls), None)

    def has(self, cls: type[Feature]) -> bool:
        """Whether the variant has a feature of class ``cls``."""
        return self.feature(cls) is not None

    @property
    def speculative(self) -> Feature | None:
        """The variant's speculative worker (EAGLE, DSpark), None without one."""
        return next((f for f in self.features if f.speculative), None)


TWO_ROWS = PoolSizes(request_rows=2)
DECODE_ARRIVALS = {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))}
RADIX_ARRIVALS = {0: ((8, 3),), 4: ((8, 3),), 8: ((8, 2),)}
EAGLE_ARRIVALS = {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))}
MIXED_ARRIVALS = {0: ((3, 10),), 2: ((13, 3),), 9: ((6, 3),)}
DSPARK_ARRIVALS = {0: ((5, 9), (6, 9)), 6: ((4, 6), (5, 6))}

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    # two requests prefilled and decoded to the end; two more recycle their rows
    Variant("non_spec_decode", 12, DECODE_ARRIVALS, pools=TWO_ROWS),
    # the same on the HIP branches (the result copied on the forward stream, no copy stream)
    Variant("non_spec_decode_hip", 12, DECODE_ARRIVALS, (Hip(),), TWO_ROWS),
    # a 13-token prompt in chunks of 4 beside a decoding request (mixed batches)
    Variant("chunked_prefill", 12, {0: ((3, 8),), 2: ((13, 3),)},
            (ChunkedPrefill(size=4, mixed=True),), TWO_ROWS),
    # the second and third prompts share a prefix with the first (prefix matched)
    Variant("radix_cache", 12, RADIX_ARRIVALS, (RadixCache(),), TWO_ROWS),
    # nothing to run for two iterations between requests (on_idle, no batch)
    Variant("idle_iteration", 10, {0: ((4, 2),), 6: ((4, 2),)}, pools=TWO_ROWS),
    # SGLang's own retraction test hook (SGLANG_TEST_RETRACT) retracts one of two decoding
    # requests every 4th forward; it is requeued and prefilled again into a freed row
    Variant("retracted_request", 16, {0: ((5, 8), (6, 8))}, (Retraction(every=4),),
            TWO_ROWS),
    # an attention-DP rank beside a scripted peer: idle batches while only the peer has
    # tokens (eager while it prefills, decode-graph replays while it decodes), its own
    # requests' prefill and decodes (eager where the peer prefills), nothing when both idle
    Variant("idle_dp_rank", 14, {5: ((4, 3),), 9: ((5, 2),)},
            (DpAttention(peer={0: PeerStep("extend", 6), 1: PeerStep("decode", 1),
                               2: PeerStep("decode", 1), 3: PeerStep("extend", 5),
                               4: PeerStep("decode", 2), 5: PeerStep("decode", 2),
                               6: PeerStep("decode", 2), 7: PeerStep("extend", 3),
                               8: PeerStep("decode", 3), 9: PeerStep("decode", 3),
                               10: PeerStep("decode", 2), 12: PeerStep("decode", 1)}),),
            TWO_ROWS),
    # non_spec_decode's requests, decode under CUDA graphs: SGLang's runner captures batch
    # sizes 1 and 2 at startup and replays them, the read-done event recorded in the graph
    Variant("graph_decode", 12, DECODE_ARRIVALS, (CudaGraphDecode(sizes=(1, 2, 4, 8)),),
            TWO_ROWS),
    # radix_cache's requests under decode CUDA graphs: the cache rewrites a row the graph's
    # in-graph attention prep reads, behind the read-done event recorded inside the graph;
    # only batch size 2 captured, so each one-request decode is padded (pad row 0, length 1)
    Variant("graph_decode_radix", 12, RADIX_ARRIVALS,
            (RadixCache(), CudaGraphDecode(sizes=(2,))), TWO_ROWS),
    # the same with a backend whose shared reads end after the replay (POST_REPLAY)
    Variant("graph_decode_post_replay", 12, RADIX_ARRIVALS,
            (RadixCache(), CudaGraphDecode(sizes=(2,), reads_end=ReadsEnd.POST_REPLAY)),
            TWO_ROWS),
    # the same with a backend that prepares its decode metadata before the replay, out of the
    # graph (PRE_REPLAY: 0.5.17's FlashInfer, Triton and FA3 for plain decode)
    Variant("graph_decode_radix_pre_replay", 12, RADIX_ARRIVALS,
            (RadixCache(), CudaGraphDecode(sizes=(2,), reads_end=ReadsEnd.PRE_REPLAY)),
            TWO_ROWS),
    # EAGLE spec v2, topk 1, 3 draft steps: prefill + draft-extend, then draft, verify and
    # draft-extend each decode; two more requests recycle the two rows
    Variant("eagle_topk1", 12, EAGLE_ARRIVALS, (Eagle(),), TWO_ROWS),
    # the same with backends that need host sequence lengths: FutureMap pulls them through
    # its private D2H stream (resolve_seq_lens_cpu), gated on the publish event
    Variant("eagle_d2h_stream", 12, EAGLE_ARRIVALS, (Eagle(needs_cpu_seq_lens=True),),
            TWO_ROWS),
    # chunked prefill mixed with EAGLE decodes: a 13-token prompt in chunks of 4 beside a
    # decoding request; the mixed batches' decode tails are late-bound behind the publish
    # event (FutureMap.resolve_mixed_spec_tails); a third request recycles a row
    Variant("eagle_mixed", 14, MIXED_ARRIVALS,
            (ChunkedPrefill(size=4, mixed=True), Eagle()), TWO_ROWS),
    # tree drafting: 4 candidates per step, 3 steps, the best 6 tree nodes verified
    Variant("eagle_topk4", 12, EAGLE_ARRIVALS, (Eagle(topk=4, num_draft_tokens=6),),
            TWO_ROWS),
    # eagle_topk1's requests grammar-constrained: the verify's grammar barrier advances the
    # previous batch's FSM on the host (advance_grammar_fsm), the verify tree is copied to
    # the host behind an event (GrammarTree), the bitmask staged and applied before sampling
    Variant("grammar_eagle_topk1", 12, EAGLE_ARRIVALS, (Eagle(), Grammar()), TWO_ROWS),
    # an embedding model: SGLang's embedding branches of run_batch (forward_batch_embedding,
    # EmbeddingBatchResult.copy_to_cpu) and of the prefill result processor; 3 prompts
    # arrive together (two rows: one waits), 2 more later recycle the rows
    Variant("embedding", 8, {0: ((5, 0), (6, 0), (4, 0)), 3: ((7, 0), (3, 0))},
            (Embedding(),), TWO_ROWS),
    # eagle_d2h_stream and eagle_mixed on the HIP branches: FutureMap's resolves wait on the
    # publish event from the host (publish_ready.synchronize()) instead of on the stream
    Variant("eagle_d2h_stream_hip", 12, EAGLE_ARRIVALS,
            (Hip(), Eagle(needs_cpu_seq_lens=True)), TWO_ROWS),
    Variant("eagle_mixed_hip", 14, MIXED_ARRIVALS,
            (Hip(), ChunkedPrefill(size=4, mixed=True), Eagle()), TWO_ROWS),
    # non_spec_decode's requests with SGLANG_ENABLE_DELAY_SAMPLE: each non-prefill-only
    # forward leaves its sampling to the scheduler (launch_batch_sample_if_needed)
    Variant("delay_sample", 12, DECODE_ARRIVALS, (DelaySample(),), TWO_ROWS),
    # eagle_topk1's requests with the target verify and the draft extend under SGLang's
    # CUDA-graph runners (its default; batch sizes 1 and 2 captured), plan stream off:
    # load_batch copies the draft output into the verify graph's buffers on the forward stream
    Variant("eagle_topk1_graph", 12, EAGLE_ARRIVALS,
            (Eagle(plan_stream=False), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphDraftExtend(sizes=(1, 2))), TWO_ROWS),
    # the same with the plan stream on (SGLANG_ENABLE_OVERLAP_PLAN_STREAM): load_batch runs
    # inside the verify's plan-stream block, between its two stream joins
    Variant("eagle_topk1_graph_plan", 12, EAGLE_ARRIVALS,
            (Eagle(), CudaGraphVerify(sizes=(1, 2)), CudaGraphDraftExtend(sizes=(1, 2))),
            TWO_ROWS),
    # eagle_topk4's tree drafting with both graphs, plan stream off (SGLang's default): the
    # static tree mask, which attention reads, is among the buffers load_batch fills
    Variant("eagle_topk4_graph", 12, EAGLE_ARRIVALS,
            (Eagle(topk=4, num_draft_tokens=6, plan_stream=False),
             CudaGraphVerify(sizes=(1, 2)), CudaGraphDraftExtend(sizes=(1, 2))), TWO_ROWS),
    # the same with the plan stream on: load_batch fills the tree's static buffers inside the
    # verify's plan-stream block
    Variant("eagle_topk4_graph_plan", 12, EAGLE_ARRIVALS,
            (Eagle(topk=4, num_draft_tokens=6), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphDraftExtend(sizes=(1, 2))), TWO_ROWS),
    # eagle_topk1 and eagle_mixed eager with the plan stream off (SGLang's default; the
    # configuration of a server with --disable-cuda-graph): the verify's and the draft
    # extend's preparation run on the forward stream
    Variant("eagle_topk1_plan_off", 12, EAGLE_ARRIVALS, (Eagle(plan_stream=False),),
            TWO_ROWS),
    Variant("eagle_mixed_plan_off", 14, MIXED_ARRIVALS,
            (ChunkedPrefill(size=4, mixed=True), Eagle(plan_stream=False)), TWO_ROWS),
    # eagle_d2h_stream and its tree twin with the plan stream off (SGLang's default) and
    # backends that need host sequence lengths (FlashInfer: SGLang's pick on SM80, and on
    # Hopper with topk > 1): resolve_seq_lens_cpu's D2H pull beside a forward-stream plan
    Variant("eagle_d2h_stream_plan_off", 12, EAGLE_ARRIVALS,
            (Eagle(needs_cpu_seq_lens=True, plan_stream=False),), TWO_ROWS),
    Variant("eagle_topk4_d2h_stream_plan_off", 12, EAGLE_ARRIVALS,
            (Eagle(topk=4, num_draft_tokens=6, needs_cpu_seq_lens=True, plan_stream=False),),
            TWO_ROWS),
    # non_spec_decode's requests, each grammar-constrained, without speculation: the worker
    # defers sampling (TpModelWorker's grammar branch); the scheduler samples after the
    # previous result advanced each grammar on the host (process_batch_result_*), the
    # bitmask built from that state, staged to the device and applied (features/grammar.py)
    Variant("grammar", 12, DECODE_ARRIVALS, (Grammar(),), TWO_ROWS),
    # radix_cache's requests, chunked in 4s, every forward by SGLang's eager runner with a
    # backend whose prefill reads end in its metadata init (PRE_REPLAY, as TRT-LLM MHA's):
    # each prefill chunk publishes its read-done event (the prefill fastpath) and the next
    # chunk's cache_unfinished_req rewrites the row behind it, not behind the whole forward
    Variant("prefill_pre_replay", 12, {0: ((13, 3),), 5: ((13, 3),), 9: ((6, 2),)},
            (ChunkedPrefill(size=4), RadixCache(), EagerPrefillReadDone()), TWO_ROWS),
    # DSpark spec v2 (gamma 3) with a ragged verify mode (cap-accept): SGLang's FutureMap
    # relays each decode's draft confidence through its pinned ring (issue_ring_copy on the
    # private D2H stream) to the next batches' verify-budget planner (resolve_confidence_cpu,
    # read on the host two steps later); backends that need host sequence lengths
    Variant("dspark_confidence_relay", 12, DSPARK_ARRIVALS, (Dspark(),), TWO_ROWS),
    # dspark_confidence_relay with backends that need no host sequence lengths (any backend
    # declaring needs_cpu_seq_lens False: FlashAttention-3 without a KV-shard pool,
    # DeepSeek-V4's under DSpark): resolve_seq_lens_cpu then leaves the D2H stream alone, so
    # only copy_done orders a ring copy before the host read, and nothing orders it before
    # the next decode's confidence scatter. SGLang 0.5.17-0.5.23 race here as released (the
    # ring copy's read of confidence_buf against the next publish's scatter, WAR;
    # docs/findings.md): the default run exits 1 on it
    Variant("dspark_no_host_lengths", 12, DSPARK_ARRIVALS, (Dspark(needs_cpu_seq_lens=False),),
            TWO_ROWS),
    # eagle_topk1's requests through SGLang's multi-layer EAGLE worker (an MTP model's draft
    # layers, one runner per draft step: MultiLayerEagleWorkerV2, features/multi_layer_eagle.py),
    # eager, plan stream on: the draft extend's preparation on the plan stream
    Variant("multi_layer_eagle", 12, EAGLE_ARRIVALS, (MultiLayerEagle(),), TWO_ROWS),
    # the same with the plan stream off (SGLang's default): the preparation on the forward
    # stream
    Variant("multi_layer_eagle_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False),), TWO_ROWS),
    # multi_layer_eagle with the boundary-KV window SGLang turns on for hybrid (mamba /
    # linear-attention) MTP models (SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX, on by default;
    # features/boundary_kv.py): each draft extend widened by front rows from a per-request
    # stash; the plan stream waits on the event the window records on the forward stream
    Variant("multi_layer_eagle_boundary_kv", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(), BoundaryKvWindow()), TWO_ROWS),
    Variant("multi_layer_eagle_boundary_kv_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False), BoundaryKvWindow()), TWO_ROWS),
    # multi_layer_eagle under CUDA graphs (SGLang's default): the target verify under its
    # graph runner, the draft extend under the runner SGLang's _capture_cuda_graphs picks,
    # every step in one graph (SGLANG_ENABLE_SINGLE_CG_DRAFT, on by default), batch sizes 1
    # and 2 captured; plan stream on and off
    Variant("multi_layer_eagle_graph", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2))), TWO_ROWS),
    Variant("multi_layer_eagle_graph_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2))), TWO_ROWS),
    # the same with one draft-extend graph per step (SGLANG_ENABLE_SINGLE_CG_DRAFT=0): the
    # worker rotates the shared input_ids between the steps' replays
    Variant("multi_layer_eagle_step_graphs", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2), single_graph=False)), TWO_ROWS),
    Variant("multi_layer_eagle_step_graphs_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2), single_graph=False)), TWO_ROWS),
    # the boundary-KV window (multi_layer_eagle_boundary_kv) under the draft-extend CUDA
    # graphs (multi_layer_eagle_graph, _step_graphs): SGLang's runner captures each request
    # widened by the window's front rows (captured_req_width), so every decode's widened draft
    # extend replays; one graph and one per step, plan stream on and off
    Variant("multi_layer_eagle_boundary_kv_graph", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(), BoundaryKvWindow(), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2))), TWO_ROWS),
    Variant("multi_layer_eagle_boundary_kv_graph_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False), BoundaryKvWindow(),
             CudaGraphVerify(sizes=(1, 2)), CudaGraphMultiLayerDraftExtend(sizes=(1, 2))),
            TWO_ROWS),
    Variant("multi_layer_eagle_boundary_kv_step_graphs", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(), BoundaryKvWindow(), CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2), single_graph=False)), TWO_ROWS),
    Variant("multi_layer_eagle_boundary_kv_step_graphs_plan_off", 12, EAGLE_ARRIVALS,
            (MultiLayerEagle(plan_stream=False), BoundaryKvWindow(),
             CudaGraphVerify(sizes=(1, 2)),
             CudaGraphMultiLayerDraftExtend(sizes=(1, 2), single_graph=False)), TWO_ROWS),
    # --enable-unified-memory: a hybrid-SWA model (window 4) whose full and SWA KV share one
    # 56-page buffer; a 40-token prompt prefilled in chunks of 10 by a backend whose prefill
    # reads end in its metadata init (PRE_REPLAY, as TRT-LLM MHA's), so the WAR barrier waits
    # only on the early read-done event; SWA eviction of the earlier chunks leaves holes, and
    # a chunk's allocation compacts them urgently (lazy compaction's _flush) while the
    # previous chunk's forward is in flight, ordered behind run_batch's forward_done event
    Variant("unified_memory", 12, {0: ((40, 2),)},
            (ChunkedPrefill(size=10),
             UnifiedMemory(buffer_pages=56, prefill_reads_end_pre_replay=True)), TWO_ROWS),
)}

#: dspark_no_host_lengths (the name the relay's tests use)
DSPARK_GPU_LENS = VARIANTS["dspark_no_host_lengths"]
