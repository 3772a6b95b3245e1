"""Host-side state of the scheduler: requests, batches, the row and slot allocators.

Everything here lives on the host, as in SGLang's scheduler: the request-pool rows (row 0 is
the padding row and is never handed out), the KV slot free list (slot 0 is the padding slot),
each request's host mirror of its ``req_to_token`` row, and ``kv_committed_len``, which lags
the device's seq_len by one verify. Freed rows and slots are reused last-in first-out, so a
finished request's row goes to the next new request (the recycled-row hazard of §9.8).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from overlap_harness.model.config import Request
from overlap_harness.model.device import Buffer, Event
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol.synth import prompt_token


class PoolExhaustedError(HarnessError):
    """The workload needs more request-pool rows or KV slots than the scenario configures."""


class FreeList:
    """A free list of integer ids ``first .. n-1``, handed out lowest first at the start.

    ``fifo=False`` (rows): the most recently freed id is the first handed out again, so a
    finished request's row goes to the next admission (the recycled-row case of §9.8).
    ``fifo=True`` (KV slots): freed ids join the back and allocation takes from the front, as
    SGLang's ``TokenToKVPoolAllocator`` does (``free_slots[:need]`` out,
    ``cat((free_slots, freed))`` back), so a new request does not get the slots just freed.
    """

    def __init__(self, first: int, n: int, what: str, *, fifo: bool = False) -> None:
        self._free: deque[int] = deque(range(first, n))
        self._what = what
        self._fifo = fifo

    def alloc(self, count: int = 1) -> list[int]:
        """Take ``count`` ids; raises :class:`PoolExhaustedError` naming the pool."""
        if count > len(self._free):
            raise PoolExhaustedError(
                f"out of {self._what}: need {count}, {len(self._free)} free; raise "
                f"protocol.{'pool_size' if self._what == 'rows' else 'max_context'}"
            )
        return [self._free.popleft() for _ in range(count)]

    def free(self, ids: list[int]) -> None:
        """Return ids: at the back (FIFO), or at the front in order (LIFO: the first of
        ``ids`` is the first handed out again)."""
        if self._fifo:
            self._free.extend(ids)
        else:
            self._free.extendleft(reversed(ids))

    def __len__(self) -> int:
        return len(self._free)


@dataclass(eq=False, slots=True)
class Req:
    """One request as the host tracks it."""

    spec: Request
    seed: int
    row: int | None = None
    slots: list[int] = field(default_factory=list)  # host mirror of req_to_token[row, :alloc]
    prefilled: int = 0  # positions whose KV the current admission has written
    target_len: int = 0  # positions to prefill in the current admission
    chunk: int = 0  # chunks done in the current admission
    kv_committed: int = 0  # host's kv_committed_len (lags the device by one verify)
    tokens: list[int] = field(default_factory=list)
    finished: bool = False
    fslot: int = 0  # FutureMap index holding its latest publish/stash
    swa_evicted: int = 0  # positions below this have their SWA mapping cleared
    seq_len_cpu: int | None = None  # last seq_len the host resolved
    ready_at: int = 0  # a retracted request is re-admitted from this iteration on

    @property
    def id(self) -> str:
        """The request id of the workload."""
        return self.spec.id

    @property
    def alloc(self) -> int:
        """Columns of its row that hold allocated slots."""
        return len(self.slots)

    def input_tokens(self) -> list[int]:
        """What a (re-)prefill feeds: the prompt, plus the outputs so far after a retract."""
        return [prompt_token(self.seed, p) for p in range(self.spec.prompt_len)] + self.tokens

    def slots_at(self, lo: int, hi: int) -> list[int]:
        """Host slot ids of positions ``[lo, hi)``; 0 (the padding slot) past the allocation."""
        return [self.slots[p] if 0 <= p < len(self.slots) else 0 for p in range(lo, hi)]


@dataclass(eq=False, slots=True)
class Batch:
    """What run_batch launches for one iteration, and what result processing needs later.

    ``slots_in`` are the FutureMap indices the gathers read (the rows at REF); ``slots_out``
    the ones publish and stash write (equal to ``slots_in`` at REF, fresh slots in the ring).
    """

    kind: str  # "prefill" | "decode" | "mixed" | "idle"
    iteration: int
    reqs: list[Req]
    chunk_ends: list[int] = field(default_factory=list)  # prefill: positions done after it
    chunk_starts: list[int] = field(default_factory=list)
    last_chunk: list[bool] = field(default_factory=list)
    slots_in: list[int] = field(default_factory=list)
    slots_out: list[int] = field(default_factory=list)
    fi: Buffer | None = None  # future_indices (S-allocated, read on F)
    fo: Buffer | None = None  # stash/publish indices when they differ (ring layout)
    seq_lens: Buffer | None = None
    seq_lens_cpu: list[int] | None = None
    host_lens: list[int] = field(default_factory=list)  # lengths the host declares with
    exact_lens: bool = True  # False: host_lens is a lower bound (backend opted out)
    pinned: list[Buffer] = field(default_factory=list)  # batch tensors for the pin ring
    held: list[Buffer] = field(default_factory=list)  # what the result queue still holds
    processed: bool = False  # its result was processed (the result queue let it go)
    results: dict[str, Buffer] = field(default_factory=dict)  # pinned D2H targets
    flags: dict[str, Buffer] = field(default_factory=dict)  # debug-check flags (device side)
    copy_done: Event | None = None
    grammar_mask: Buffer | None = None
    logits: Buffer | None = None
    rows: list[int] = field(default_factory=list)  # request-pool rows, fixed at creation
    parts: tuple[Batch, ...] = ()  # mixed: (prefill part, decode part)
    mix_idx: Buffer | None = None  # mixed: mix_running_indices (S-built, read by F's gather)

    def __post_init__(self) -> None:
        self.rows = [r.row or 0 for r in self.reqs]

    @property
    def ids(self) -> list[str]:
        """Request ids in batch order."""
        return [r.id for r in self.reqs]

    @property
    def m(self) -> int:
        """Batch size."""
        return len(self.reqs)


def rows_cols(rows: list[int], ranges: list[tuple[int, int]], cols: int) -> tuple:
    """A fancy-index selection of ``(row, lo:hi)`` per request, clipped to ``[0, cols)``.

    This is how a launch declares "columns lo:hi of each of these rows of req_to_token" as one
    element-precise access.
    """
    rr: list[np.ndarray] = []
    cc: list[np.ndarray] = []
    for row, (lo, hi) in zip(rows, ranges, strict=True):
        c = np.arange(max(0, lo), max(0, min(hi, cols)), dtype=np.int64)
        rr.append(np.full(c.size, row, dtype=np.int64))
        cc.append(c)
    if not rr:
        return (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    return (np.concatenate(rr), np.concatenate(cc))


def request_seed(rid: str) -> int:
    """A stable integer seed from a request id (no Python hash randomisation)."""
    h = 7
    for ch in rid.encode():
        h = (h * 131 + ch) % 1_000_003
    return h
