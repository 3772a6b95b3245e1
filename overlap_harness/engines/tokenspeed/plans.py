"""The scheduler scripts of the variants: which requests each round extends (a prompt, or a
chunk of it after a cached or earlier-chunk prefix) and which it decodes, as TokenSpeed's
scheduler would plan them (extends first, then decodes; one request per pool slot, slot 0
never used: TokenSpeed keeps row 0 for capture warm-up)."""

from __future__ import annotations

from dataclasses import dataclass, field

from overlap_harness.engines.tokenspeed.stand_ins.front_end import (
    PAGE_SIZE,
    ForwardOpStandIn,
    PlanStandIn,
)


@dataclass
class Request:
    """A request's prompt and slot, and how many of its tokens are in the KV cache."""

    rid: str
    slot: int
    prompt: list[int]
    cached: int = 0
    pages: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Extend:
    """Extend ``rid`` by ``length`` prompt tokens (None: the rest of its prompt)."""

    rid: str
    length: int | None = None


@dataclass(frozen=True, slots=True)
class Decode:
    """Decode ``rid`` (its ``width`` input ids come from the executor's token table)."""

    rid: str


class Script:
    """Builds the rounds' plans, keeping each request's cached length and pages."""

    def __init__(self, requests: list[Request], decode_width: int = 1) -> None:
        self.requests = {r.rid: r for r in requests}
        self.decode_width = decode_width
        self._next_page = 1

    def _grow(self, request: Request, length: int, fresh: list[int] | None = None
              ) -> list[int]:
        request.cached += length
        while len(request.pages) * PAGE_SIZE < request.cached:
            request.pages.append(self._next_page)
            if fresh is not None:
                fresh.append(self._next_page)
            self._next_page += 1
        return list(request.pages)

    def round(self, *steps: Extend | Decode) -> PlanStandIn:
        """One round's plan (no steps: a round with no forward)."""
        extends = [s for s in steps if isinstance(s, Extend)]
        decodes = [s for s in steps if isinstance(s, Decode)]
        if not steps:
            return PlanStandIn([])
        op = ForwardOpStandIn([], [], [], [], [], [], len(extends))
        fresh: list[int] = []  # pages this round hands out: the plan zeroes them first
        for step in extends:
            request = self.requests[step.rid]
            start = request.cached
            length = step.length if step.length is not None else len(request.prompt) - start
            op.request_ids.append(request.rid)
            op.request_pool_indices.append(request.slot)
            op.input_lengths.append(length)
            op.extend_prefix_lens.append(start)
            op.prefill_lengths.append(len(request.prompt))
            op.input_ids.extend(request.prompt[start:start + length])
            op.pages.append(self._grow(request, length, fresh))
        for step in decodes:
            request = self.requests[step.rid]
            op.request_ids.append(request.rid)
            op.request_pool_indices.append(request.slot)
            op.input_lengths.append(self.decode_width)
            op.pages.append(self._grow(request, self.decode_width, fresh))
        return PlanStandIn([op], pages_to_zero=fresh)

    def cached_prefix(self, rid: str, length: int) -> None:
        """``rid``'s first ``length`` prompt tokens are already cached (a prefix hit)."""
        self._grow(self.requests[rid], length)


def three_requests() -> list[Request]:
    """Three requests in slots 1..3 with prompts of 6, 5 and 10 tokens."""
    return [Request("r0", 1, [11, 12, 13, 14, 15, 16]), Request("r1", 2, [21, 22, 23, 24, 25]),
            Request("r2", 3, list(range(31, 41)))]
