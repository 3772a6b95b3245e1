"""The front end around TokenSpeed's event loop, standing in for what is not on the overlap
path: the C++ scheduler (a script of execution plans, each a forward op with the fields the
scheduler's ``Forward`` op exports), the request states the output processor keeps (only what
the loop gathers before a dispatch), the output processor's commit (the host reads of the
committed tensors), and the loop's hooks (cache tiers, PD, EPLB, EPD, pause, metrics), which
are empty on a single-rank engine without those features. Each hook is strict: a call the
driver did not plan for fails with its name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names TokenSpeed's line that called into the front end

PAGE_SIZE = 4
GROUP_ID = "full"  # the one cache group of the stand-in model's KV pool
VIRTUAL_BLOCKS = 64


@dataclass
class ForwardOpStandIn:
    """One forward of the scheduler's plan: extends first, then decodes (the scheduler's
    order); ``block_tables_arrays()`` gives each request's pages, as the C++ op exports."""

    request_ids: list[str]
    request_pool_indices: list[int]
    input_lengths: list[int]
    extend_prefix_lens: list[int]
    prefill_lengths: list[int]
    input_ids: list[int]
    extends: int
    decode_input_ids: list[int] | None = None
    pages: list[list[int]] = field(default_factory=list)

    @property
    def extend_replay_lens(self) -> list[int]:
        """No bounded replay (every extend feeds new positions only)."""
        return [0] * self.extends

    @property
    def shifted_input_ids(self) -> list[int]:
        """The prompt ids shifted one left (the drafter's input); -1 closes each chunk."""
        return [*self.input_ids[1:], -1] if self.input_ids else []

    def num_extends(self) -> int:
        """How many leading requests are extends."""
        return self.extends

    def block_tables_arrays(self) -> dict[str, np.ndarray]:
        """The one cache group's table: a row of page ids per request, padded with -1."""
        width = max((len(p) for p in self.pages), default=1) or 1
        table = np.full((len(self.request_ids), width), -1, dtype=np.int32)
        for row, pages in enumerate(self.pages):
            table[row, :len(pages)] = pages
        return {GROUP_ID: table}


@dataclass
class PlanStandIn:
    """An execution plan: the forward (or none), and no cache, PD or zeroing work."""

    forward: list[ForwardOpStandIn]
    cache: list[Any] = field(default_factory=list)
    pages_to_zero: list[int] = field(default_factory=list)
    remote_decode: Any = None
    remote_prefill: Any = None


class KvPoolStandIn:
    """The model's KV pool as the executor's page zeroing and the forward see it: one page
    table of ``VIRTUAL_BLOCKS`` pages; ``zero_pages`` clears pages on the current stream (the
    default stream, where ``ModelExecutor.zero_cache_pages`` runs it)."""

    def __init__(self) -> None:
        import torch

        self.kv = torch.zeros(VIRTUAL_BLOCKS, PAGE_SIZE, device="cuda")

    def zero_pages(self, page_ids: list[int]) -> None:
        """Clear ``page_ids`` (a new owner must not read the previous one's KV)."""
        import torch

        self.kv[torch.tensor(page_ids)] = 0.0


class ExecutionEventStandIn:
    """``tokenspeed_scheduler.ExecutionEvent``: the events one advance carries."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def add_event(self, event: Any) -> None:
        """Carry ``event`` to the scheduler."""
        self.events.append(event)


class ScriptedScheduler:
    """The scheduler as a script: each round's plan in order; after the script one empty
    round (the loop commits what is still in flight) and the engine's shutdown event set."""

    def __init__(self, plans: list[PlanStandIn], shutdown: threading.Event) -> None:
        self._plans = list(plans)
        self._shutdown = shutdown
        self.advanced: list[list[Any]] = []
        self.rounds = 0

    def next_execution_plan(self) -> PlanStandIn:
        """This round's plan."""
        self.rounds += 1
        if not self._plans:
            self._shutdown.set()
            return PlanStandIn([])
        return self._plans.pop(0)

    def advance(self, execution_event: ExecutionEventStandIn) -> None:
        """Take the round's committed changes."""
        self.advanced.append(list(execution_event.events))

    def empty_lcm_blocks(self) -> int:
        """Free pages (statistics only)."""
        return VIRTUAL_BLOCKS // 2

    def active_lcm_blocks(self) -> int:
        """Pages in use (statistics only)."""
        return VIRTUAL_BLOCKS // 4

    def waiting_size(self) -> int:
        """Queued requests (statistics only)."""
        return 0


class CommittingOutputProcessor:
    """The output processor's commit as the overlap protocol sees it: the committed
    result's host tensors read (the tokens, the lengths, the NaN flags when present), and
    nothing fed back (no request finishes inside a script)."""

    def __init__(self, rid_to_state: dict[str, Any]) -> None:
        self.rid_to_state = rid_to_state
        self.committed: list[tuple[list[int], list[int]]] = []

    def post_process_forward_op(self, forward_op: Any, results: Any, *,
                                is_prefill_instance: bool) -> list[Any]:
        """Read the committed tokens on the host; no request changes."""
        tokens = results.output_tokens.tolist()
        lengths = results.output_lengths.tolist()
        if results.output_nan_flags is not None:
            results.output_nan_flags.tolist()
        self.committed.append((tokens, lengths))
        return []


def request_state(sampling_params: Any, input_length: int) -> StrictStub:
    """What the loop gathers of one request before a dispatch (``rid_to_state[rid]``)."""
    return StrictStub("request state", sampling_params=sampling_params, grammar=None,
                      input_length=input_length, logprob_start_len=input_length,
                      wants_input_logprobs=False, input_token_logprobs_val=None)


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _empty(*args: Any, **kwargs: Any) -> list[Any]:
    return []


def hooks() -> dict[str, Any]:
    """The event loop's hooks of features a single-rank engine without cache tiers, PD,
    EPLB or EPD leaves empty, and its metrics and logging sinks."""
    return {
        "_epd_hooks": StrictStub("epd hooks", drain_ready_embeddings=_none,
                                 assert_embeddings_received=_none),
        "_cache_hooks": StrictStub("cache hooks", poll_ready_events=_empty,
                                   count_plan_ops=_none),
        "_pause": StrictStub("pause", forward_blocked=False, maybe_finish_drain=_none),
        "_l3_hooks": StrictStub("l3 hooks", revalidate_queued_hits=_none,
                                prepare_forward=lambda plan, op: (op, [])),
        "load_reporter": StrictStub("load reporter", observe=_none,
                                    sample_and_observe=_none),
        "metrics": StrictStub("metrics", record_scheduler_iteration=_none,
                              record_jit_compiles=_none),
        "_batch_logger": StrictStub("batch logger", log_dispatch=_none, record_decode=_none),
        "_eplb_hooks": StrictStub("eplb hooks", note_round=_none),
        "_pd_hooks": StrictStub("pd hooks", poll_transfer_events=_empty,
                                record_prefill_usage=_none),
        "_scheduler_cache_geometry": StrictStub("cache geometry",
                                                num_usable_pages=VIRTUAL_BLOCKS),
        "request_handler": StrictStub("request handler", forward_ct=0,
                                      _profile_batch_predicate=_none),
        "_publish_scheduler_kv_events": _none,
        "_process_new_requests": _none,
    }
