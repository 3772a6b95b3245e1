"""The device API: the seam between the protocol and the two devices.

Named after torch.cuda so the CUDA device is a thin adapter. The protocol calls only these
methods; ``sim.SimDevice`` implements them on simpy and ``gpu_check.CudaDevice`` on real
streams. Every sync takes a :class:`SyncLabel` so a scenario can remove it by name
(``Device(removed=[...])``) and a report can name it.

Accesses are element-precise: a launch declares ``reads`` and ``writes`` as ``(buffer, sel)``
pairs, where ``sel`` is ``None`` (the whole buffer), an int, a slice, a 1-D index sequence or
tensor (rows of the leading dimension), or a tuple of those (``(row, slice(cur, nxt))``).
The op's function receives each read buffer's whole value (a snapshot taken when the op
starts, on the simulated device) and returns one value per write, assigned as
``buf[sel] = value`` when the op ends.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NewType, TypeAlias

import numpy as np
import torch

from overlap_harness.model.errors import DeviceUsageError

StreamId = NewType("StreamId", int)
EventId = NewType("EventId", int)
BufferId = NewType("BufferId", int)

Sel: TypeAlias = Any  # None | int | slice | Sequence[int] | torch.Tensor | np.ndarray | tuple
OpFn: TypeAlias = Callable[..., Any]


class SyncLabel(StrEnum):
    """Stable names of every synchronization the protocol performs (SCENARIOS.md)."""

    FORWARD_ENTRY = "forward_entry"
    WAR_BARRIER = "war_barrier"
    # the two branches of SGLang 0.5.23's _apply_war_barrier, removable one at a time
    # (scheduler.py 2021 / 2023); ``war_barrier`` removes both
    WAR_BARRIER_READ_DONE_WAIT = "war_barrier.read_done_wait"
    WAR_BARRIER_FALLBACK_WAIT = "war_barrier.fallback_wait"
    # the decode CUDA graph runner's read-done records (decode_cuda_graph_runner.py 670 / 696)
    READ_DONE_RECORD_IN_GRAPH = "read_done.record_in_graph"
    READ_DONE_RECORD_POST_REPLAY = "read_done.record_post_replay"
    PUBLISH_READY_SCHEDULE_WAIT = "publish_ready.schedule_wait"
    PUBLISH_READY_D2H_WAIT = "publish_ready.d2h_wait"
    PUBLISH_READY_HOST_WAIT = "publish_ready.host_wait"
    D2H_HOST_SYNC = "d2h.host_sync"
    SEQ_LENS_CPU_SYNC = "seq_lens.cpu_sync"
    COPY_DONE_HOST_SYNC = "copy_done.host_sync"
    # the empty batch's own wait (protocol.idle_result_sync; SGLang 0.5.23's
    # process_batch_result_idle)
    COPY_DONE_IDLE_HOST_SYNC = "copy_done.idle_host_sync"
    VERIFY_DONE_SCHEDULE_WAIT = "verify_done.schedule_wait"
    FUTURE_INDICES_RECORD_STREAM = "future_indices.record_stream"
    BATCH_PIN_RING = "batch_pin_ring"
    PLAN_WAIT = "plan.forward_wait"
    PLAN_SCHEDULE_WAIT = "plan.schedule_wait"
    # SGLang 0.5.23's plan-stream joins around verify's and the draft extend's preparations
    # (protocol.plan_stream_joins; eagle_worker_common.py 588 / 601, eagle_worker_v2.py
    # 1161 / 1177)
    PLAN_VERIFY_FORWARD_WAIT = "plan.verify_forward_wait"
    PLAN_VERIFY_JOIN = "plan.verify_join"
    PLAN_EXTEND_FORWARD_WAIT = "plan.extend_forward_wait"
    PLAN_EXTEND_JOIN = "plan.extend_join"
    DELAYED_SAMPLING_ENTRY = "delayed_sampling.forward_wait"
    MIX_INDICES_KEEP_ALIVE = "mix_running_indices.keep_alive"
    MIX_INDICES_RECORD_STREAM = "mix_running_indices.record_stream"
    STASH_ORDER = "stash.fifo"
    # SGLang 0.5.23 (python/sglang/srt/managers/overlap_utils.py); docs/protocol-model-notes.md
    CONFIDENCE_D2H_WAIT = "confidence.d2h_wait"
    CONFIDENCE_COPY_DONE_QUERY = "confidence.copy_done_query"
    MIXED_TAILS_FORWARD_WAIT = "mixed_tails.forward_wait"
    MIXED_TAILS_HOST_WAIT = "mixed_tails.host_wait"
    MIXED_TAILS_D2H_WAIT = "mixed_tails.d2h_wait"
    RESOLVE_STREAM_ORDER = "resolve.stream_order"
    # SGLang 0.5.23's result copy (scheduler.py 5032, utils/common.py 616)
    COPY_STREAM_FORWARD_WAIT = "copy_stream.forward_wait"
    D2H_RESULT_RECORD_STREAM = "d2h_result.record_stream"
    # SGLang 0.5.23's record_stream of the verify's inputs on F (protocol.verify_record_stream;
    # spec_utils.py 369-404 before the preparation, eagle_worker_common.py 597 after it)
    VERIFY_PRE_PREPARE_RECORD_STREAM = "verify_pre_prepare.record_stream"
    VERIFY_INPUTS_RECORD_STREAM = "verify_inputs.record_stream"
    # TokenSpeed 0.1.1's one-forward-thread loop (protocol.loop = "one_forward_thread"):
    # the execution stream's waits on the default stream before a forward and before the
    # valid cache lengths are written (model_executor.py 1911 / 1861), the output copy's
    # event record (2238) and the commit's host wait on it (types.py 232)
    EXEC_FORWARD_WAIT = "exec.forward_wait"
    EXEC_CACHE_LENGTHS_WAIT = "exec.cache_lengths_wait"
    COPY_EVENT_RECORD = "copy_event.record"
    COPY_EVENT_HOST_WAIT = "copy_event.host_wait"


@dataclass(frozen=True, slots=True)
class Stream:
    """A FIFO queue of device work."""

    id: StreamId
    name: str


@dataclass(frozen=True, slots=True)
class Event:
    """A CUDA-style event: captures a stream's work at record time."""

    id: EventId
    name: str


@dataclass(eq=False, slots=True)
class Buffer:
    """A named device (or pinned host) tensor. ``storage`` is the memory block behind it."""

    id: BufferId
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    pinned: bool
    storage: int
    freed: bool = False
    ids: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def numel(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape)) if self.shape else 1

    def elements(self, sel: Sel) -> np.ndarray:
        """Flat element ids that ``buf[sel]`` touches, as a 1-D int64 array (vectorised)."""
        if sel is None:
            return self.ids.reshape(-1)
        if type(sel) is np.ndarray:  # the common case, without the conversions below
            picked = self.ids[sel]  # kept per access: no second (reshaped) header if 1-D
            return picked if picked.ndim == 1 else picked.reshape(-1)
        return np.asarray(self.ids[_np_sel(sel)]).reshape(-1)


def _np_sel(sel: Sel) -> Any:
    if isinstance(sel, torch.Tensor):
        return sel.detach().cpu().numpy()
    if isinstance(sel, tuple):
        return tuple(_np_sel(s) for s in sel)
    if isinstance(sel, list):
        return np.asarray(sel, dtype=np.int64)
    return sel


def torch_sel(sel: Sel, device: torch.device | str) -> Any:
    """``sel`` in a form torch indexing accepts on ``device`` (lists become index tensors)."""
    if isinstance(sel, tuple):
        return tuple(torch_sel(s, device) for s in sel)
    if isinstance(sel, list | np.ndarray):
        return torch.as_tensor(np.asarray(sel, dtype=np.int64), device=device)
    if isinstance(sel, torch.Tensor) and sel.device != torch.device(device):
        return sel.to(device)
    return sel


AccessSpec: TypeAlias = "Buffer | tuple[Buffer, Sel]"

_HERE = str(Path(__file__).resolve().parent.parent)
_SKIP_SOURCE = ("model/device.py", "sim/", "gpu_check/cuda_device.py")


# (id of a code object, offset of its instruction) -> "file:line" of that call site, interned
# (every op of a protocol line gets the one string), or "" in a device layer. Keyed by the
# code object's id, not the object: a code object hashes its whole body, and the line number
# of an instruction is found by walking the code's line table, both in time that grows with
# the function (about 3 us for a 300-line function); the id and the offset cost nothing.
# _CODES keeps every code object keyed alive, so no other can take its id.
_SOURCES: dict[tuple[int, int], str] = {}
_CODES: dict[int, CodeType] = {}
_SOURCES_KEPT = 1 << 16  # call sites remembered before starting afresh (code made at run time)


def caller_source() -> str:
    """``file:line`` of the first frame outside the device layers: the protocol line.

    Found once per call site (a run issues thousands of ops from a few hundred lines) and
    interned, so the nodes of one line share one string."""
    f = sys._getframe(2)
    while f is not None:
        source = _SOURCES.get((id(f.f_code), f.f_lasti))
        if source is None:
            source = _call_site(f)
        if source:
            return source
        f = f.f_back
    return ""


def _call_site(f: FrameType) -> str:
    """What :func:`caller_source` keeps for the instruction ``f`` is at: its ``file:line``
    (the file relative to the package root), or "" where ``f`` runs device-layer code."""
    if len(_SOURCES) >= _SOURCES_KEPT:
        _SOURCES.clear()
        _CODES.clear()
    code = f.f_code
    path = code.co_filename
    rel = path[len(_HERE) + 1 :] if path.startswith(_HERE) else path
    source = "" if rel.startswith(_SKIP_SOURCE) else sys.intern(f"{rel}:{f.f_lineno}")
    _CODES[id(code)] = code
    _SOURCES[(id(code), f.f_lasti)] = source
    return source


def norm_accesses(specs: Iterable[AccessSpec]) -> list[tuple[Buffer, Sel]]:
    """Turn ``buf`` or ``(buf, sel)`` items into ``(buf, sel)`` pairs, checking liveness."""
    out = []
    for s in specs:
        if type(s) is tuple and len(s) == 2:  # already a pair (the usual form): kept as is
            buf = s[0]
        else:
            buf, sel = (s, None) if isinstance(s, Buffer) else s
            s = (buf, sel)
        if buf.freed:
            raise DeviceUsageError(f"access to freed buffer {buf.name!r}")
        out.append(s)
    return out


class Device(ABC):
    """The device API the protocol is written against.

    Subclasses implement the ``_do_*`` hooks; this base applies sync-label removal (a removed
    sync is skipped and logged in ``skipped_syncs``) and keeps the current iteration.
    """

    torch_device: str = "cpu"

    def __init__(self, removed: Iterable[SyncLabel | str] = (),
                 query_outcomes: Mapping[tuple[str, int, int], bool] | None = None) -> None:
        self.removed: frozenset[SyncLabel] = frozenset(SyncLabel(r) for r in removed)
        # forced answers of branching queries, by query site (see :meth:`query`)
        self.query_outcomes = dict(query_outcomes or {})
        self._query_counts: dict[tuple[str, int], int] = {}  # (event, iteration) -> so far
        self.skipped_syncs: list[tuple[str, int]] = []
        self.labels_used: set[str] = set()  # every label the protocol reached, kept or removed
        self.iteration = -1
        self.observations: dict[tuple[str, int], list[torch.Tensor]] = {}

    # -- bookkeeping ---------------------------------------------------------------------
    def set_iteration(self, n: int) -> None:
        """Tag everything issued from now on with scheduler iteration ``n``."""
        self.iteration = n

    def sync_enabled(self, label: SyncLabel | None) -> bool:
        """False when the scenario removed ``label``; the skip is logged once per call."""
        if label is not None:
            self.labels_used.add(str(label))
        if label is None or label not in self.removed:
            return True
        self.skipped_syncs.append((str(label), self.iteration))
        return False

    # -- resources -----------------------------------------------------------------------
    @abstractmethod
    def stream(self, name: str) -> Stream:
        """Create (or return) the stream called ``name``."""

    @abstractmethod
    def event(self, name: str) -> Event:
        """Create a new, never-recorded event."""

    @abstractmethod
    def buffer(
        self,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype,
        *,
        pinned: bool = False,
        fill: float | int | None = None,
        stream: Stream | None = None,
    ) -> Buffer:
        """Allocate a buffer through the caching allocator.

        ``stream`` is the allocation stream (reuse follows it); with ``fill`` the buffer is
        initialised by a write op on that stream, or by the host when ``stream`` is None.
        Without ``fill`` its content is whatever the memory held (``torch.empty``).
        """

    @abstractmethod
    def free(self, buf: Buffer) -> None:
        """The host drops its last reference: the block goes back to the caching allocator."""

    def record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None = None) -> None:
        """Tell the allocator ``stream`` uses ``buf``: reuse waits for that stream's work."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_record_stream(buf, stream, label)

    # -- work ----------------------------------------------------------------------------
    @abstractmethod
    def launch(
        self,
        stream: Stream,
        name: str,
        fn: OpFn,
        reads: Sequence[AccessSpec] = (),
        writes: Sequence[AccessSpec] = (),
        cost_us: float = 0.0,
        observe: str | None = None,
    ) -> None:
        """Enqueue a kernel: ``fn(*read_values)`` returns one value per write.

        With ``observe``, the values the op read (each read's ``buf[sel]``, as it started) are
        kept in ``observations[(observe, iteration)]``, out of band: no access, no ordering.
        The oracle compares these with the serial run's, so a stale read shows as a value.
        """

    @abstractmethod
    def copy(
        self,
        stream: Stream,
        src: AccessSpec,
        dst: AccessSpec,
        *,
        non_blocking: bool,
        cost_us: float = 0.0,
        label: SyncLabel | None = None,
        name: str = "copy",
    ) -> None:
        """Copy ``src`` to ``dst`` on ``stream``; blocking copies also block the host until done.

        ``label`` names the host wait of a blocking copy (removing it makes it non-blocking).
        """

    @abstractmethod
    def host_work(self, name: str, cost_us: float) -> None:
        """The host is busy for ``cost_us`` on its own (scheduling, result processing)."""

    @abstractmethod
    def host_read(self, buf: Buffer, sel: Sel = None, name: str = "host_read") -> torch.Tensor:
        """The host reads pinned memory: the value as of the host's current time."""

    @abstractmethod
    def host_write(self, buf: Buffer, sel: Sel, value: Any, name: str = "host_write") -> None:
        """The host writes pinned memory."""

    # -- sync ----------------------------------------------------------------------------
    def record(self, event: Event, stream: Stream, label: SyncLabel | None = None) -> None:
        """Capture the work enqueued on ``stream`` so far; re-recording replaces it."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_record(event, stream, label)

    def wait_event(self, stream: Stream, event: Event, label: SyncLabel | None = None) -> None:
        """Later ops on ``stream`` wait for the record that is latest now (no-op if none)."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_wait_event(stream, event, label)

    def wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None = None) -> None:
        """``waiter`` waits for all work enqueued on ``other`` so far."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_wait_stream(waiter, other, label)

    def synchronize(
        self, target: Stream | Event | None = None, label: SyncLabel | None = None
    ) -> None:
        """Block the host until ``target`` (a stream, an event, or the whole device) is done."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_synchronize(target, label)

    def query(self, event: Event, label: SyncLabel | None = None) -> bool:
        """Non-blocking probe used as a branch: has the event's captured work completed?

        A True answer is an *observation* (STREAM-SEMANTICS.md, "Program edges and
        observations"): what the host issues after seeing it is ordered after the event's
        work, but whether it is True depends on timing, so a device decides the outcome by a
        rule that does not (the simulator: False unless a run forces True, so exploration can
        cover both outcomes). A removed ``label`` makes the probe answer False.

        Every device names a query site the same way, ``(event name, iteration, occurrence
        of that event's queries in the iteration)``, so a forced answer
        (``query_outcomes``) means the same probe on every device; the device gets the site
        and the forced answer (None: not forced).
        """
        if not self.sync_enabled(label):
            return False
        counted = (event.name, self.iteration)
        occurrence = self._query_counts.get(counted, 0)
        self._query_counts[counted] = occurrence + 1
        site = (event.name, self.iteration, occurrence)
        return self._do_query(event, label, site, self.query_outcomes.get(site))

    def poll(self, event: Event, label: SyncLabel | None = None) -> None:
        """``while not event.query(): pass``: a polling loop always ends on True, so it orders
        the host after the event's work like ``synchronize(event)``, as an observation."""
        if label is None or self.sync_enabled(label):  # None: never removed
            self._do_poll(event, label)

    @abstractmethod
    def _do_query(self, event: Event, label: SyncLabel | None, site: tuple[str, int, int],
                  forced: bool | None) -> bool: ...

    @abstractmethod
    def _do_poll(self, event: Event, label: SyncLabel | None) -> None: ...

    @abstractmethod
    def _do_record(self, event: Event, stream: Stream, label: SyncLabel | None) -> None: ...

    @abstractmethod
    def _do_wait_event(self, stream: Stream, event: Event, label: SyncLabel | None) -> None: ...

    @abstractmethod
    def _do_wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None) -> None: ...

    @abstractmethod
    def _do_synchronize(self, target: Stream | Event | None, label: SyncLabel | None) -> None: ...

    @abstractmethod
    def _do_record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None) -> None: ...
