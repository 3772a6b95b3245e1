"""The variants of SGLang's overlap loop the adapter drives: configurations and arrivals."""

from __future__ import annotations

from dataclasses import dataclass, field

from overlap_harness.engines.sglang.features.dp_attention import PeerStep
from overlap_harness.engines.sglang.features.dspark import DsparkConfig
from overlap_harness.engines.sglang.features.eagle import EagleConfig
from overlap_harness.engines.sglang.features.unified_memory import UnifiedMemoryConfig
from overlap_harness.engines.sglang.scheduler_build import PoolSizes


@dataclass(frozen=True, slots=True)
class Variant:
    """One configuration of the real loop: the server options that choose its path, the
    requests that arrive (iteration -> (prompt length, max new tokens) each), how many
    iterations run."""

    name: str
    iterations: int
    arrivals: dict[int, tuple[tuple[int, int], ...]]
    chunked_prefill_size: int | None = None
    mixed_chunk: bool = False
    radix_cache: bool = False
    graph_runner: bool = True  # decode forwards publish the runner's read-done event
    hip: bool = False
    retract_every: int | None = None  # SGLang's test hook: retract at every n-th forward
    # decode batches replayed by SGLang's decode CUDA-graph runner, capturing these sizes
    # (features/decode_graph.py); the worker then plays no runner
    decode_graph_sizes: tuple[int, ...] = ()
    # the graph's attention backend declares its shared reads end after the replay
    # (POST_REPLAY: the runner records a fresh read-done event) instead of inside it
    graph_reads_end_post_replay: bool = False
    # ... or its decode metadata is prepared before the replay, out of the graph (PRE_REPLAY)
    graph_reads_end_pre_replay: bool = False
    pools: PoolSizes = field(default_factory=PoolSizes)
    # attention DP (tp 2, attn-dp 2): this rank beside a peer whose steps are scripted per
    # iteration (absent iterations: the peer is idle); None: no DP
    dp_peer: dict[int, PeerStep] | None = None
    eagle: EagleConfig | None = None  # SGLang's EAGLE v2 worker (spec decoding) when set
    # DSpark spec decoding with its confidence relay (features/dspark.py) when set
    dspark: DsparkConfig | None = None
    grammar: bool = False  # every request grammar-constrained (features/grammar.py)
    embedding: bool = False  # an embedding model (is_generation False: features/embedding.py)
    delay_sample: bool = False  # SGLANG_ENABLE_DELAY_SAMPLE on (features/delay_sample.py)
    # every forward run by SGLang's EagerRunner, its attention backend declaring a prefill's
    # shared reads ended in its metadata init (PRE_REPLAY: features/eager_prefill.py)
    eager_prefill_pre_replay: bool = False
    # --enable-unified-memory: a hybrid-SWA model's full and SWA KV in SGLang's unified pool,
    # lazily compacted behind the forward_done event run_batch records (features/unified_memory.py)
    unified_memory: UnifiedMemoryConfig | None = None


TWO_ROWS = PoolSizes(request_rows=2)

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    # two requests prefilled and decoded to the end; two more recycle their rows
    Variant("non_spec_decode", 12, {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))},
            pools=TWO_ROWS),
    # the same on the HIP branches (the result copied on the forward stream, no copy stream)
    Variant("non_spec_decode_hip", 12, {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))},
            pools=TWO_ROWS, hip=True),
    # a 13-token prompt in chunks of 4 beside a decoding request (mixed batches)
    Variant("chunked_prefill", 12, {0: ((3, 8),), 2: ((13, 3),)},
            chunked_prefill_size=4, mixed_chunk=True, pools=TWO_ROWS),
    # the second and third prompts share a prefix with the first (prefix matched)
    Variant("radix_cache", 12, {0: ((8, 3),), 4: ((8, 3),), 8: ((8, 2),)},
            radix_cache=True, pools=TWO_ROWS),
    # nothing to run for two iterations between requests (on_idle, no batch)
    Variant("idle_iteration", 10, {0: ((4, 2),), 6: ((4, 2),)}, pools=TWO_ROWS),
    # SGLang's own retraction test hook (SGLANG_TEST_RETRACT) retracts one of two decoding
    # requests every 4th forward; it is requeued and prefilled again into a freed row
    Variant("retracted_request", 16, {0: ((5, 8), (6, 8))}, retract_every=4,
            pools=TWO_ROWS),
    # an attention-DP rank beside a scripted peer: idle batches while only the peer has
    # tokens (eager while it prefills, decode-graph replays while it decodes), its own
    # requests' prefill and decodes (eager where the peer prefills), nothing when both idle
    Variant("idle_dp_rank", 14, {5: ((4, 3),), 9: ((5, 2),)}, pools=TWO_ROWS,
            dp_peer={0: PeerStep("extend", 6), 1: PeerStep("decode", 1),
                     2: PeerStep("decode", 1), 3: PeerStep("extend", 5),
                     4: PeerStep("decode", 2), 5: PeerStep("decode", 2),
                     6: PeerStep("decode", 2), 7: PeerStep("extend", 3),
                     8: PeerStep("decode", 3), 9: PeerStep("decode", 3),
                     10: PeerStep("decode", 2), 12: PeerStep("decode", 1)}),
    # non_spec_decode's requests, decode under CUDA graphs: SGLang's runner captures batch
    # sizes 1 and 2 at startup and replays them, the read-done event recorded in the graph
    Variant("graph_decode", 12, {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))},
            pools=TWO_ROWS, graph_runner=False, decode_graph_sizes=(1, 2, 4, 8)),
    # radix_cache's requests under decode CUDA graphs: the cache rewrites a row the graph's
    # in-graph attention prep reads, behind the read-done event recorded inside the graph;
    # only batch size 2 captured, so each one-request decode is padded (pad row 0, length 1)
    Variant("graph_decode_radix", 12, {0: ((8, 3),), 4: ((8, 3),), 8: ((8, 2),)},
            radix_cache=True, pools=TWO_ROWS, graph_runner=False, decode_graph_sizes=(2,)),
    # the same with a backend whose shared reads end after the replay (POST_REPLAY)
    Variant("graph_decode_post_replay", 12, {0: ((8, 3),), 4: ((8, 3),), 8: ((8, 2),)},
            radix_cache=True, pools=TWO_ROWS, graph_runner=False, decode_graph_sizes=(2,),
            graph_reads_end_post_replay=True),
    # the same with a backend that prepares its decode metadata before the replay, out of the
    # graph (PRE_REPLAY: 0.5.17's FlashInfer, Triton and FA3 for plain decode)
    Variant("graph_decode_radix_pre_replay", 12, {0: ((8, 3),), 4: ((8, 3),), 8: ((8, 2),)},
            radix_cache=True, pools=TWO_ROWS, graph_runner=False, decode_graph_sizes=(2,),
            graph_reads_end_pre_replay=True),
    # EAGLE spec v2, topk 1, 3 draft steps: prefill + draft-extend, then draft, verify and
    # draft-extend each decode; two more requests recycle the two rows
    Variant("eagle_topk1", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))}, pools=TWO_ROWS,
            eagle=EagleConfig()),
    # the same with backends that need host sequence lengths: FutureMap pulls them through
    # its private D2H stream (resolve_seq_lens_cpu), gated on the publish event
    Variant("eagle_d2h_stream", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(needs_cpu_seq_lens=True)),
    # chunked prefill mixed with EAGLE decodes: a 13-token prompt in chunks of 4 beside a
    # decoding request; the mixed batches' decode tails are late-bound behind the publish
    # event (FutureMap.resolve_mixed_spec_tails); a third request recycles a row
    Variant("eagle_mixed", 14, {0: ((3, 10),), 2: ((13, 3),), 9: ((6, 3),)},
            chunked_prefill_size=4, mixed_chunk=True, pools=TWO_ROWS, eagle=EagleConfig()),
    # tree drafting: 4 candidates per step, 3 steps, the best 6 tree nodes verified
    Variant("eagle_topk4", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))}, pools=TWO_ROWS,
            eagle=EagleConfig(topk=4, num_draft_tokens=6)),
    # eagle_topk1's requests grammar-constrained: the verify's grammar barrier advances the
    # previous batch's FSM on the host (advance_grammar_fsm), the verify tree is copied to
    # the host behind an event (GrammarTree), the bitmask staged and applied before sampling
    Variant("grammar_eagle_topk1", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(), grammar=True),
    # an embedding model: SGLang's embedding branches of run_batch (forward_batch_embedding,
    # EmbeddingBatchResult.copy_to_cpu) and of the prefill result processor; 3 prompts
    # arrive together (two rows: one waits), 2 more later recycle the rows
    Variant("embedding", 8, {0: ((5, 0), (6, 0), (4, 0)), 3: ((7, 0), (3, 0))},
            pools=TWO_ROWS, graph_runner=False, embedding=True),
    # eagle_d2h_stream and eagle_mixed on the HIP branches: FutureMap's resolves wait on the
    # publish event from the host (publish_ready.synchronize()) instead of on the stream
    Variant("eagle_d2h_stream_hip", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(needs_cpu_seq_lens=True), hip=True),
    Variant("eagle_mixed_hip", 14, {0: ((3, 10),), 2: ((13, 3),), 9: ((6, 3),)},
            chunked_prefill_size=4, mixed_chunk=True, pools=TWO_ROWS, eagle=EagleConfig(),
            hip=True),
    # non_spec_decode's requests with SGLANG_ENABLE_DELAY_SAMPLE: each non-prefill-only
    # forward leaves its sampling to the scheduler (launch_batch_sample_if_needed)
    Variant("delay_sample", 12, {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))},
            pools=TWO_ROWS, delay_sample=True),
    # eagle_topk1's requests with the target verify and the draft extend under SGLang's
    # CUDA-graph runners (its default; batch sizes 1 and 2 captured), plan stream off:
    # load_batch copies the draft output into the verify graph's buffers on the forward stream
    Variant("eagle_topk1_graph", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(verify_graph_sizes=(1, 2), draft_extend_graph=True,
                                              plan_stream=False)),
    # the same with the plan stream on (SGLANG_ENABLE_OVERLAP_PLAN_STREAM): load_batch runs
    # inside the verify's plan-stream block, between its two stream joins
    Variant("eagle_topk1_graph_plan", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(verify_graph_sizes=(1, 2), draft_extend_graph=True)),
    # eagle_topk4's tree drafting with both graphs, plan stream off (SGLang's default): the
    # static tree mask, which attention reads, is among the buffers load_batch fills
    Variant("eagle_topk4_graph", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(topk=4, num_draft_tokens=6,
                                              verify_graph_sizes=(1, 2),
                                              draft_extend_graph=True, plan_stream=False)),
    # the same with the plan stream on: load_batch fills the tree's static buffers inside the
    # verify's plan-stream block
    Variant("eagle_topk4_graph_plan", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(topk=4, num_draft_tokens=6,
                                              verify_graph_sizes=(1, 2),
                                              draft_extend_graph=True)),
    # eagle_topk1 and eagle_mixed eager with the plan stream off (SGLang's default; the
    # configuration of a server with --disable-cuda-graph): the verify's and the draft
    # extend's preparation run on the forward stream
    Variant("eagle_topk1_plan_off", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(plan_stream=False)),
    Variant("eagle_mixed_plan_off", 14, {0: ((3, 10),), 2: ((13, 3),), 9: ((6, 3),)},
            chunked_prefill_size=4, mixed_chunk=True, pools=TWO_ROWS,
            eagle=EagleConfig(plan_stream=False)),
    # eagle_d2h_stream and its tree twin with the plan stream off (SGLang's default) and
    # backends that need host sequence lengths (FlashInfer: SGLang's pick on SM80, and on
    # Hopper with topk > 1): resolve_seq_lens_cpu's D2H pull beside a forward-stream plan
    Variant("eagle_d2h_stream_plan_off", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(needs_cpu_seq_lens=True, plan_stream=False)),
    Variant("eagle_topk4_d2h_stream_plan_off", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(topk=4, num_draft_tokens=6,
                                              needs_cpu_seq_lens=True, plan_stream=False)),
    # non_spec_decode's requests, each grammar-constrained, without speculation: the worker
    # defers sampling (TpModelWorker's grammar branch); the scheduler samples after the
    # previous result advanced each grammar on the host (process_batch_result_*), the
    # bitmask built from that state, staged to the device and applied (features/grammar.py)
    Variant("grammar", 12, {0: ((5, 4), (6, 4)), 5: ((4, 3), (5, 3))}, pools=TWO_ROWS,
            grammar=True),
    # radix_cache's requests, chunked in 4s, every forward by SGLang's eager runner with a
    # backend whose prefill reads end in its metadata init (PRE_REPLAY, as TRT-LLM MHA's):
    # each prefill chunk publishes its read-done event (the prefill fastpath) and the next
    # chunk's cache_unfinished_req rewrites the row behind it, not behind the whole forward
    Variant("prefill_pre_replay", 12, {0: ((13, 3),), 5: ((13, 3),), 9: ((6, 2),)},
            chunked_prefill_size=4, radix_cache=True, pools=TWO_ROWS, graph_runner=False,
            eager_prefill_pre_replay=True),
    # DSpark spec v2 (gamma 3) with a ragged verify mode (cap-accept): SGLang's FutureMap
    # relays each decode's draft confidence through its pinned ring (issue_ring_copy on the
    # private D2H stream) to the next batches' verify-budget planner (resolve_confidence_cpu,
    # read on the host two steps later); backends that need host sequence lengths
    Variant("dspark_confidence_relay", 12, {0: ((5, 9), (6, 9)), 6: ((4, 6), (5, 6))},
            pools=TWO_ROWS, dspark=DsparkConfig()),
    # dspark_confidence_relay with backends that need no host sequence lengths (any backend
    # declaring needs_cpu_seq_lens False; DeepSeek-V4's under DSpark): resolve_seq_lens_cpu
    # then leaves the D2H stream alone, so only copy_done orders a ring copy before the host
    # read, and nothing orders it before the next decode's confidence scatter. SGLang
    # 0.5.17-0.5.23 race here as released (the ring copy's read of confidence_buf against the
    # next publish's scatter, WAR; docs/findings.md): the default run exits 1 on it
    Variant("dspark_no_host_lengths", 12, {0: ((5, 9), (6, 9)), 6: ((4, 6), (5, 6))},
            pools=TWO_ROWS, dspark=DsparkConfig(needs_cpu_seq_lens=False)),
    # eagle_topk1's requests through SGLang's multi-layer EAGLE worker (an MTP model's draft
    # layers, one runner per draft step: MultiLayerEagleWorkerV2, features/multi_layer_eagle.py),
    # eager, plan stream on: the draft extend's preparation on the plan stream
    Variant("multi_layer_eagle", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(multi_layer=True)),
    # the same with the plan stream off (SGLang's default): the preparation on the forward
    # stream
    Variant("multi_layer_eagle_plan_off", 12, {0: ((5, 6), (6, 6)), 6: ((4, 5), (5, 5))},
            pools=TWO_ROWS, eagle=EagleConfig(multi_layer=True, plan_stream=False)),
    # --enable-unified-memory: a hybrid-SWA model (window 4) whose full and SWA KV share one
    # 56-page buffer; a 40-token prompt prefilled in chunks of 10 by a backend whose prefill
    # reads end in its metadata init (PRE_REPLAY, as TRT-LLM MHA's), so the WAR barrier waits
    # only on the early read-done event; SWA eviction of the earlier chunks leaves holes, and
    # a chunk's allocation compacts them urgently (lazy compaction's _flush) while the
    # previous chunk's forward is in flight, ordered behind run_batch's forward_done event
    Variant("unified_memory", 12, {0: ((40, 2),)}, chunked_prefill_size=10, pools=TWO_ROWS,
            graph_runner=False,
            unified_memory=UnifiedMemoryConfig(buffer_pages=56,
                                               prefill_reads_end_pre_replay=True)),
)}

#: dspark_no_host_lengths (the name the relay's tests use)
DSPARK_GPU_LENS = VARIANTS["dspark_no_host_lengths"]
