"""The variants of SGLang's overlap loop the adapter drives: configurations and arrivals."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    pools: PoolSizes = field(default_factory=PoolSizes)


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    # two requests prefilled, decoded until they finish; two more take their rows
    Variant("non_spec_decode", 12, {0: ((5, 4), (6, 4)), 6: ((4, 3), (5, 3))}),
)}
