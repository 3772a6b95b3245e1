"""Scenario configuration: one frozen, slotted dataclass per TOML table (SCENARIOS.md).

Each field carries ``metadata={"help": ...}``; the loader (``scenarios.loader``) validates a
file against these fields generically (unknown keys, types, enum choices, ranges given by
``metadata["range"]``) and the key reference (docs/scenario-keys.md) is generated from them.
No I/O here, and nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    NON_SPEC = "non_spec"
    SPEC_V2 = "spec_v2"


class SeqLensSync(StrEnum):
    VERIFY_DONE = "verify_done"
    PUBLISH_READY = "publish_ready"


class SeqLensD2H(StrEnum):
    SCHEDULE_STREAM = "schedule_stream"
    D2H_STREAM = "d2h_stream"
    NONE = "none"


class WarBarrier(StrEnum):
    NONE = "none"
    LOOP_TOP = "loop_top"
    READ_DONE = "read_done"
    AFTER_LAUNCH = "after_launch"
    AFTER_REPLAY_PREPARE = "after_replay_prepare"
    AFTER_LAUNCH_READ_DONE = "after_launch_read_done"


class DecodeReadDone(StrEnum):
    AFTER_READS = "after_reads"
    IN_GRAPH = "in_graph"
    POST_REPLAY = "post_replay"
    PRE_REPLAY = "pre_replay"


class PublishPoint(StrEnum):
    AFTER_VERIFY = "after_verify"
    AFTER_DRAFT_EXTEND = "after_draft_extend"


class Gather(StrEnum):
    UNFUSED = "unfused"
    FUSED = "fused"
    TRITON = "triton"


class Platform(StrEnum):
    CUDA = "cuda"
    HIP = "hip"


class StashStream(StrEnum):
    FORWARD = "forward"
    SIDE = "side"


class FutureLayout(StrEnum):
    ROWS = "rows"
    RING = "ring"


class Loop(StrEnum):
    """Which engine's loop design runs the workload."""

    SGLANG_OVERLAP = "sglang_overlap"
    ONE_FORWARD_THREAD = "one_forward_thread"


class Expect(StrEnum):
    """The verdicts a run can get: the detector found no race / a race; no race but a debug
    check fired (poison assert, allocation overrun, ring alias); the harness refused the run."""

    RACE_FREE = "race_free"
    RACE = "race"
    FAULT = "fault"
    ERROR = "error"


class EventKind(StrEnum):
    RETRACT = "retract"
    IDLE = "idle"
    EVICT_SWA = "evict_swa"
    FINISH_LATE = "finish_late"
    SKIP_PUBLISH = "skip_publish"
    DOUBLE_STASH = "double_stash"
    MIXED_CHUNK = "mixed_chunk"
    SKIP_SEED = "skip_seed"


def _f(default, help: str, range: tuple | None = None, late: bool = False):
    """A field with its help text; ``late``: added after run ids were published, so a run id
    hashes it only when it differs from its default (older runs keep their ids)."""
    meta = {"help": help}
    if range is not None:
        meta["range"] = range
    if late:
        meta["late"] = True
    if isinstance(default, list | dict | tuple):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, slots=True)
class ProtocolConfig:
    """Which variant of the overlap protocol runs."""

    mode: Mode = _f(Mode.SPEC_V2, "non_spec relays output tokens only; spec_v2 relays seq_lens, bonus, top-k and hidden states")
    seq_lens_sync: SeqLensSync = _f(SeqLensSync.PUBLISH_READY, "verify_done: legacy S wait on verify end (before #25879); publish_ready: seq_lens relayed through the FutureMap")
    seq_lens_d2h: SeqLensD2H = _f(SeqLensD2H.D2H_STREAM, "how the host gets seq_lens: blocking .cpu() on S, the private D2H stream, or none (backend opts out)")
    war_barrier: WarBarrier = _f(WarBarrier.LOOP_TOP, "where S is fenced behind F: none, loop top (#26380), read_done event (#28363), after each launch (#31687), an event recorded after replay_prepare's metadata reads, or after_launch_read_done: SGLang 0.5.23's _apply_war_barrier after each launch, waiting the read_done event a non-spec decode records after its reads, else all of F (spec-v2: the draft-extend runner clears it; prefill and mixed batches record none)")
    publish_point: PublishPoint = _f(PublishPoint.AFTER_VERIFY, "where publish_ready is recorded in the forward")
    gather: Gather = _f(Gather.FUSED, "spec-extras gather implementation")
    topk: int = _f(1, "draft top-k", (1, 8))
    num_steps: int = _f(3, "draft steps", (1, 8))
    num_draft_tokens: int = _f(4, "tokens verified per request (topk=1 requires num_steps+1)", (1, 64))
    hidden_states: bool = _f(True, "whether hidden states are relayed (spec_need_hidden_states)")
    debug_poison: bool = _f(False, "-1 poison plus assert/invalidate after every gather (SGLANG_IS_IN_CI)")
    platform: Platform = _f(Platform.CUDA, "cuda, or hip (host waits on publish_ready; no D2H stream; no barrier unless forced)")
    force_barrier: bool = _f(False, "apply the WAR barrier on hip too (#27967)")
    pool_size: int = _f(16, "request-pool rows; row 0 is the padding row", (2, 4096))
    alloc_factor: int = _f(2, "KV over-allocation factor in prepare_for_decode (2 at REF)", (1, 4))
    pin_ring_depth: int = _f(2, "iterations a batch's snapshot tensors stay pinned", (0, 4))
    decode_read_done: DecodeReadDone = _f(DecodeReadDone.AFTER_READS, "with war_barrier after_launch_read_done, how a non-spec decode's read-done event is recorded: after_reads (one event after the forward's reads, never removed), in_graph (SGLang 0.5.23's decode CUDA graph with the base backend's IN_REPLAY read end: the external event recorded inside the captured graph at each replay, label read_done.record_in_graph), post_replay (a POST_REPLAY backend: a fresh event recorded after the replay, label read_done.record_post_replay; the in-graph one is recorded too and left unused, decode_cuda_graph_runner.py 655-697), pre_replay (a PRE_REPLAY backend, its decode metadata read before the replay: the same fresh event, recorded after those reads, from the same SGLang line and so under the same label; the in-graph one unused, decode_cuda_graph_runner.py 2008-2009)", late=True)
    max_running_requests: int = _f(0, "non-spec: at most this many requests in SGLang's running batch (0: rows only). A prefill admits only what get_num_allocatable_reqs allows, the batch's size counted before update_running_batch filters out the requests finished since the last schedule (scheduler.py get_new_batch_prefill; the harness gives SGLang as many as request rows)", (0, 4096), late=True)
    skip_finishing_decode: bool = _f(False, "non-spec: leave out of the decode batch a request whose queued result commits its last token by length (SGLang 0.5.23's _reqs_finishing_inflight, scheduler.py 4444-4457, on in event_loop_overlap)", late=True)
    prefill_rewrites_prefix: bool = _f(False, "a prefill chunk writes its request's req_to_token row from column 0, the prefix's entries again (SGLang 0.5.23's write_req_to_token_pool_triton, allocation.py 452)", late=True)
    radix_cache_rewrite: bool = _f(False, "after a prefill's result, the radix cache rewrites each unfinished request's req_to_token row on S (RadixCache.cache_unfinished_req through req_to_token_pool.write, memory_pool.py 414)", late=True)
    copy_stream: bool = _f(False, "results copied to the host on a copy stream that waits on F (SGLang 0.5.23's _copy_result_to_cpu on CUDA, scheduler.py 5032)", late=True)
    async_d2h: bool = _f(False, "results copied with SGLang 0.5.23's async_d2h: the host keeps only the pinned copy and drops the device result at once, kept alive for the copy by record_stream on the copying stream (utils/common.py 608-617)", late=True)
    result_queue_hold: bool = _f(False, "the result queue holds each batch's future_indices (SGLang 0.5.23: batch.copy()'s req_pool_indices) until its result is processed, ring or not", late=True)
    idle_result_sync: bool = _f(False, "an empty (DP idle) batch's host wait on its copy_done is its own statement (SGLang 0.5.23's process_batch_result_idle, batch_result_processor.py 946), removable alone as copy_done.idle_host_sync; copy_done.host_sync still removes it too", late=True)
    stash_stream: StashStream = _f(StashStream.FORWARD, "stream the stash runs on; side = a stream with no event (scenario 1's bug)")
    future_layout: FutureLayout = _f(FutureLayout.ROWS, "rows: one FutureMap slot per request-pool row (REF); ring: the old ring (#13713)")
    ring_size: int = _f(4, "slots of the old FutureMap ring", (1, 4096))
    delayed_sampling: bool = _f(False, "non-spec grammar path: sample, stash and copy after F waits on S")
    delayed_stash_after_gather: bool = _f(False, "enqueue the delayed-sampling stash after the next gather (scenario 24's bug)")
    plan_stream: bool = _f(False, "prepare metadata on the plan stream PL (SGLANG_ENABLE_OVERLAP_PLAN_STREAM)")
    plan_stream_joins: bool = _f(False, "spec-v2: SGLang 0.5.23's plan streams instead of plan_stream's once-per-batch plan: verify's preparation runs on the target worker's plan stream, the draft extend's on the draft worker's own (a new stream each, eagle_worker_v2.py 1363 and 241), each behind the plan stream's wait on F and followed by F's wait on it (eagle_worker_common.py 586-601, labels plan.verify_forward_wait and plan.verify_join; eagle_worker_v2.py 1160-1178, labels plan.extend_forward_wait and plan.extend_join); verify's computes a tree's out_cache_loc from req_to_token (topk > 1, eagle_utils.py 356-364; topk 1 takes the chain draft's, built on F), the draft's the extend lengths from seq_lens (eagle_worker_common.py 171-214)", late=True)
    verify_graph_load: bool = _f(False, "spec-v2 with plan_stream_joins: the target verify replays SGLang's CUDA graph, so its preparation on the plan stream also copies the draft tokens and the verify slots into the graph's static input buffers (eagle_prepare_for_verify -> DecodeCudaGraphRunner.load_batch, eagle_utils.py 405-408), which the verify forward then reads instead of the draft's own outputs", late=True)
    verify_record_stream: bool = _f(False, "spec-v2: SGLang 0.5.23's record_stream of the verify's inputs on F, so the allocator keeps them while the verify may read them: before the preparation the lengths, the draft tokens and a chain's verify slots (record_stream_for_v2_verify, spec_utils.py 369-404, label verify_pre_prepare.record_stream), after it the tokens and slots the verify reads (eagle_worker_common.py 597, label verify_inputs.record_stream)", late=True)
    alias_schedule_forward: bool = _f(False, "S and F are the same stream (#31681); the harness rejects it")
    swa: bool = _f(False, "model a sliding-window attention mapping full_to_swa_index_mapping")
    swa_window: int = _f(6, "sliding-window length in tokens when swa is on", (1, 1 << 20))
    hidden_size: int = _f(4, "draft hidden-state width H", (1, 4096))
    max_context: int = _f(128, "columns of req_to_token", (8, 1 << 20))
    # SGLang 0.5.23 mechanisms (docs/protocol-model-notes.md); each default leaves them out
    confidence_relay: bool = _f(False, "DSpark confidence relay (0.5.23): publish scatters confidence on F, D copies it into a pinned ring of depth 3 with copy_done events, the planner reads slot ring_pos-2 if copy_done.query() says done", late=True)
    mixed_spec_tails: bool = _f(False, "resolve_mixed_spec_tails (0.5.23) on every spec decode batch: F waits publish_ready (HIP: the host synchronizes it), gathers the fresh lengths and tail slots, then the CPU copy (D2H stream, or .cpu() on F)", late=True)
    spec_mixed_batches: bool = _f(False, "spec-v2: a mixed_chunk event builds SGLang 0.5.23's spec mixed batch (an extend of the prefill chunk plus one token per running request): resolve_forward_inputs keeps mix_running_indices alive by record_stream(F) (overlap_utils.py 121-128), late-binds the decode tails by resolve_mixed_spec_tails on this batch only (543-586: F waits publish_ready, the fresh lengths and tail slots gathered on F into a new seq_lens, the host's copy from the D2H stream), gathers the tails' input ids from output_tokens_buf; one target extend, publish, draft extend and stash follow; the next filter_batch reads that seq_lens on S (schedule_batch.py 3878)", late=True)
    stream_ordered_resolve: bool = _f(False, "resolve_seq_lens_cpu(stream_ordered=True) (0.5.23, HIP with seq_lens_d2h = none): the seq_lens gather runs on F after forward_entry, fenced by stream order only", late=True)
    adopted_relay: bool = _f(False, "new_seq_lens_buf is a FutureRelayBuffers tensor adopted from a static verify CUDA graph (0.5.23): the graph's replay scatters the new seq_lens, publish skips its scatter and records publish_ready", late=True)
    consume_once: bool = _f(False, "with debug_poison: the consume-once assert (0.5.23): publish arms a host flag, each event-waiting resolve asserts it and clears it", late=True)
    # TokenSpeed 0.1.1's design (model/protocol/one_forward_thread.py, docs/tokenspeed.md)
    loop: Loop = _f(Loop.SGLANG_OVERLAP, "sglang_overlap: the schedule/forward-stream overlap loop (every key above); one_forward_thread: TokenSpeed's design, one thread issuing all GPU work on an execution stream that waits on the default stream, results committed through a copy event (only the one_forward_thread keys below and pool_size apply)", late=True)
    in_flight_depth: int = _f(1, "one_forward_thread: forwards in flight when a round is committed (1: round n-1 is committed after round n is issued; 0: each round is committed at once)", (0, 1), late=True)
    draft_width: int = _f(0, "one_forward_thread: draft tokens per decode (a drafter on the execution stream writes the next round's 1 + k ids into the token table)", (0, 8), late=True)
    page_size: int = _f(4, "one_forward_thread: tokens per KV page; a round zeroes the pages it hands out on the default stream", (1, 1024), late=True)
    cached_prefix: int = _f(0, "one_forward_thread: prompt tokens a request arriving after iteration 0 finds in the KV cache (a prefix hit): its first extend starts there", (0, 1 << 20), late=True)


@dataclass(frozen=True, slots=True)
class Request:
    """One request of the workload."""

    id: str = _f("", "request name, unique in the scenario")
    arrive: int = _f(0, "iteration at which it is scheduled", (0, 1 << 20))
    prompt_len: int = _f(8, "prompt tokens", (1, 1 << 20))
    max_new: int = _f(8, "output tokens after which it finishes", (1, 1 << 20))
    chunks: int = _f(1, "chunked prefill: number of prefill chunks", (1, 64))


@dataclass(frozen=True, slots=True)
class WorkloadEvent:
    """Something that happens at one iteration."""

    at: int = _f(0, "iteration", (0, 1 << 20))
    kind: EventKind = _f(EventKind.IDLE, "what happens")
    id: str = _f("", "the request it concerns (not for idle)")


@dataclass(frozen=True, slots=True)
class Workload:
    """The iteration trace the scheduler sees."""

    iterations: int = _f(8, "scheduler iterations to run", (1, 10_000))
    requests: tuple[Request, ...] = _f((), "the requests")
    events: tuple[WorkloadEvent, ...] = _f((), "per-iteration events")


@dataclass(frozen=True, slots=True)
class Timing:
    """The cost model, in microseconds; also the GPU replay's target."""

    host_launch: float = _f(5.0, "host time to issue one op", (0.0, 1e6))
    schedule_prep: float = _f(300.0, "host time of get_next_batch_to_run", (0.0, 1e7))
    process_results: float = _f(50.0, "host time of pop_and_process", (0.0, 1e7))
    schedule_kernel: float = _f(10.0, "duration of one small S kernel", (0.0, 1e6))
    forward: float = _f(2000.0, "duration of one forward (draft + verify + draft-extend)", (0.0, 1e8))
    verify_share: float = _f(0.6, "fraction of the forward done when verify publishes", (0.0, 1.0))
    d2h: float = _f(10.0, "duration of one D2H copy", (0.0, 1e6))
    jitter: float = _f(0.0, "+- fraction applied to every duration, seeded", (0.0, 0.9))


@dataclass(frozen=True, slots=True)
class Check:
    """What the scenario expects."""

    expect: Expect = _f(Expect.RACE_FREE, "race_free, race, fault (race-free but a debug check fired) or error (the harness must refuse the run, e.g. S aliasing F)")
    races: tuple[str, ...] = _f((), 'races that must be among those found, as "KIND buffer"')
    explore: int = _f(0, "extra seeded timing perturbations to try for manifest races", (0, 100_000))
    seed: int = _f(0, "seed for jitter and exploration", (0, 2**31 - 1))


@dataclass(frozen=True, slots=True)
class Mutation:
    """One extra run with syncs removed (and optionally protocol keys changed)."""

    remove: tuple[str, ...] = _f((), "sync labels to remove")
    set: dict = _f({}, "protocol keys to override in this run, e.g. {war_barrier = \"none\"}")
    expect: Expect = _f(Expect.RACE, "verdict expected with these syncs removed")
    races: tuple[str, ...] = _f((), 'races that must be among those found, as "KIND buffer"')
    name: str = _f("", "short name; defaults to the removed labels joined by +")
    allow_unused: bool = _f(False, "accept removing a sync this configuration never reaches (else the run is an error: it would change nothing)")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scenario file."""

    name: str = _f("", "unique in a suite")
    description: str = _f("", "one line for people")
    protocol: ProtocolConfig = _f(ProtocolConfig(), "protocol variant")
    workload: Workload = _f(Workload(), "workload")
    timing: Timing = _f(Timing(), "cost model")
    check: Check = _f(Check(), "expectation")
    mutation: tuple[Mutation, ...] = _f((), "extra runs with syncs removed")
    profile: str = _f("", "a device profile (profiles/*.json from `calibrate`) whose measured costs the simulator charges, relative to this file's folder or absolute; --profile on the command line wins; not part of run ids (docs/calibration.md)")
    path: str = field(default="", metadata={"help": "file it came from (set by the loader)", "internal": True})
