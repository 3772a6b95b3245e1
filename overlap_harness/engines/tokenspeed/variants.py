"""TokenSpeed's variants: each a scheduler script and an executor configuration, driven
through TokenSpeed's own loop (:func:`.driver.run`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from overlap_harness.engines.tokenspeed.driver import Setup, run
from overlap_harness.engines.tokenspeed.plans import Decode, Extend, Script, three_requests

DECODES = 4


def _plain_decode() -> tuple[list, list]:
    requests = three_requests()
    script = Script(requests)
    everyone = [r.rid for r in requests]
    rounds = [script.round(*[Extend(r) for r in everyone])]
    rounds += [script.round(*[Decode(r) for r in everyone]) for _ in range(DECODES)]
    return requests, rounds


def _chunked_prefill() -> tuple[list, list]:
    """r2's 10-token prompt in chunks of 4, 4 and 2, each beside the others' decodes
    (mixed batches), then all decode."""
    requests = three_requests()
    script = Script(requests)
    rounds = [script.round(Extend("r0"), Extend("r1")),
              script.round(Extend("r2", 4), Decode("r0"), Decode("r1")),
              script.round(Extend("r2", 4), Decode("r0"), Decode("r1")),
              script.round(Extend("r2"), Decode("r0"), Decode("r1"))]
    rounds += [script.round(Decode("r0"), Decode("r1"), Decode("r2")) for _ in range(2)]
    return requests, rounds


def _prefix_reuse() -> tuple[list, list]:
    """r1 and r2 find their first 4 prompt tokens cached: their extends start at 4 (the
    executor rewinds their valid cache lengths to the prefix before the forward)."""
    requests = three_requests()
    script = Script(requests)
    script.cached_prefix("r1", 4)
    script.cached_prefix("r2", 4)
    rounds = [script.round(Extend("r0")),
              script.round(Extend("r1"), Extend("r2"), Decode("r0"))]
    rounds += [script.round(Decode("r0"), Decode("r1"), Decode("r2")) for _ in range(3)]
    return requests, rounds


def _idle_step() -> tuple[list, list]:
    """A round with no forward between decodes: the loop commits everything in flight."""
    requests = three_requests()
    script = Script(requests)
    everyone = [r.rid for r in requests]
    rounds = [script.round(*[Extend(r) for r in everyone]),
              script.round(*[Decode(r) for r in everyone]),
              script.round(),
              script.round(*[Decode(r) for r in everyone]),
              script.round(*[Decode(r) for r in everyone])]
    return requests, rounds


def _drafter() -> tuple[list, list]:
    requests = three_requests()
    script = Script(requests, decode_width=3)
    everyone = [r.rid for r in requests]
    rounds = [script.round(*[Extend(r) for r in everyone])]
    rounds += [script.round(*[Decode(r) for r in everyone]) for _ in range(DECODES)]
    return requests, rounds


SETUPS: dict[str, Setup] = {s.name: s for s in (
    Setup("plain_decode", _plain_decode),
    Setup("chunked_prefill", _chunked_prefill),
    Setup("prefix_reuse", _prefix_reuse),
    Setup("cuda_graph_decode", _plain_decode, graphs=True),
    Setup("eagle_drafter", _drafter, draft_width=2),
    Setup("idle_step", _idle_step),
    Setup("no_overlap", _plain_decode, in_flight_depth=0),
)}


def variant_runs() -> dict[str, Callable[[], Any]]:
    """Every variant by name; each run returns the recorder's ``Watch``."""
    return {name: (lambda s=setup: run(s)) for name, setup in SETUPS.items()}
