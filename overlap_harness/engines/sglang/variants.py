"""The variants of SGLang's overlap loop the adapter drives: configurations and arrivals."""

from __future__ import annotations

from dataclasses import dataclass, field

from overlap_harness.engines.sglang.eagle_build import EagleConfig
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
    pools: PoolSizes = field(default_factory=PoolSizes)
    eagle: EagleConfig | None = None  # SGLang's EAGLE v2 worker (spec decoding) when set


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
)}
