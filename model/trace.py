"""Result records shared by both devices, the detector and the reports.

These are plain frozen dataclasses: ``reports`` reads them and nothing else, and a GPU run
produces the same records as a simulated one, so one report code path draws both.
Times are integer nanoseconds (no float drift); ``None`` where a device cannot know them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

OpId = NewType("OpId", int)

HOST = "host"


class OpKind(StrEnum):
    """What an entry of the timeline is."""

    KERNEL = "kernel"
    COPY = "copy"
    RECORD = "record"
    WAIT = "wait"
    HOST_SYNC = "host_sync"
    HOST_READ = "host_read"
    HOST_WRITE = "host_write"
    ALLOC = "alloc"
    FREE = "free"
    QUERY = "query"
    HOST_WORK = "host_work"


#: Op kinds by position, and each kind's position: compact records (plain tuples the cyclic
#: GC does not track) keep the position and turn it back into the kind when read.
OP_KINDS: tuple[OpKind, ...] = tuple(OpKind)
OP_KIND_INDEX: dict[OpKind, int] = {kind: index for index, kind in enumerate(OP_KINDS)}


class RaceKind(StrEnum):
    """The kinds of race STREAM-SEMANTICS.md names."""

    RAW = "RAW"
    WAR = "WAR"
    WAW = "WAW"
    HOST_D2H = "host-D2H"
    REUSE = "reuse"


@dataclass(frozen=True, slots=True)
class OpRecord:
    """One entry of a timeline: an op on a stream, or a host action.

    Args:
        op: issue-order id, unique in a run.
        name: what the protocol called the op (``"verify"``, ``"stash"``).
        agent: ``"host"`` or the stream's name.
        kind: see :class:`OpKind`.
        issue_ns: host time at which it was issued.
        start_ns / end_ns: when it ran (for a host sync: the blocked span).
        label: the sync label, for syncs; ``None`` otherwise.
        iteration: scheduler iteration that issued it (-1 before the loop).
        source: ``file:line`` of the protocol code that issued it.
    """

    op: OpId
    name: str
    agent: str
    kind: OpKind
    issue_ns: int
    start_ns: int
    end_ns: int
    label: str | None = None
    iteration: int = -1
    source: str = ""


@dataclass(frozen=True, slots=True)
class Access:
    """One side of a race: which op touched which elements of which buffer, and how."""

    op: OpId
    op_name: str
    agent: str
    buffer: str
    mode: str  # "read" | "write"
    iteration: int
    source: str
    label: str | None = None
    time_ns: int | None = None

    def describe(self) -> str:
        """One line naming the access, like CSAN's report lines."""
        verb = "reading" if self.mode == "read" else "writing"
        where = f" at {self.source}" if self.source else ""
        it = f" (iteration {self.iteration})" if self.iteration >= 0 else ""  # -1: no loop
        return f"{self.op_name}{it} on {self.agent} {verb} {self.buffer}{where}"


@dataclass(frozen=True, slots=True)
class Race:
    """Two conflicting accesses that neither happens before the other.

    ``first`` was issued before ``second``. For a reuse race, ``buffer`` names the memory's
    earlier owner (still in use) and ``reused_as`` the buffer it was handed out as.
    ``elements`` are flat element ids of the buffer
    (``shape`` gives the layout); ``manifest`` is True when this run's timing executed the two
    accesses in the opposite order to their issue order (the order the serial oracle runs), so
    the reader saw another value, or the final value differs; ``None`` when unknown.
    """

    kind: RaceKind
    buffer: str
    shape: tuple[int, ...]
    elements: tuple[int, ...]
    first: Access
    second: Access
    manifest: bool | None = None
    reused_as: str | None = None  # reuse races: the new owner; ``buffer`` is the old one
    older: bool = False  # ``first`` is hidden behind a later access of its agent (still racing)
    needs: tuple[str, ...] = ()  # branch outcomes it exists under (empty: under every outcome)

    @property
    def key(self) -> str:
        """``"RAW new_seq_lens_buf"``: the form scenario files use in ``check.races``."""
        return f"{self.kind} {self.buffer}"

    def describe(self) -> str:
        """The user-facing report: both accesses, the elements, latent or manifest (said
        only when the run was timed: a recorder's races carry no timing)."""
        state = {True: " (manifest)", False: " (latent)", None: ""}[self.manifest]
        reused = f" (reused as {self.reused_as})" if self.reused_as else ""
        if self.older:
            reused += " (an older access, behind a later one of the same agent)"
        if self.needs:
            reused += " (only when " + " and ".join(self.needs) + ")"
        return (
            f"{self.kind} race on {self.buffer}{describe_elements(self.shape, self.elements)}"
            f"{reused}"
            f"{state}\n  first:  {self.first.describe()}\n  second: {self.second.describe()}"
        )


def describe_elements(shape: tuple[int, ...], flat: tuple[int, ...], limit: int = 6) -> str:
    """Render flat element ids as indices: ``[3, 5]`` for 1-D, ``[2, 4:8]`` for rows of 2-D."""
    if not flat:
        return "[]"
    if len(shape) <= 1:
        return "[" + _ranges(sorted(flat), limit) + "]"
    cols = 1
    for d in shape[1:]:
        cols *= d
    rows: dict[int, list[int]] = {}
    for e in sorted(flat):
        rows.setdefault(e // cols, []).append(e % cols)
    parts = []
    for r, cs in list(rows.items())[:limit]:
        parts.append(f"{r}" if len(cs) == cols else f"{r}, {_ranges(cs, limit)}")
    more = "" if len(rows) <= limit else f" +{len(rows) - limit} rows"
    return "[" + "; ".join(parts) + more + "]"


def _ranges(values: list[int], limit: int) -> str:
    out: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(f"{start}" if start == prev else f"{start}:{prev + 1}")
        if v is not None:
            start = prev = v
    more = "" if len(out) <= limit else f",+{len(out) - limit}"
    return ",".join(out[:limit]) + more


@dataclass(frozen=True, slots=True)
class QuerySite:
    """One ``query()`` a run made as a branch, and the outcome the run gave it.

    ``(event, iteration, occurrence)`` names it across runs (occurrence counts the queries of
    that event in that iteration); ``forced`` says the run was told the outcome (exploration)
    rather than taking the default, False, which orders nothing.
    """

    event: str
    iteration: int
    occurrence: int
    outcome: bool
    forced: bool = False
    source: str = ""

    @property
    def key(self) -> tuple[str, int, int]:
        """What ``SimDevice(query_outcomes=...)`` takes."""
        return (self.event, self.iteration, self.occurrence)

    def describe(self) -> str:
        """``query(copy_done)@3#0 = True``: how a race names the outcome it needs."""
        return f"query({self.event})@{self.iteration}#{self.occurrence} = {self.outcome}"


class DeviceRun:
    """Everything one device run produced: the timeline, the races, the syncs skipped.

    ``timeline`` and ``races`` may be given as lists or as zero-argument functions that build
    them: a device passes its builders, and the records are made the first time each is read
    (then kept). The run's work (every op simulated, every racing pair found) is done when
    the device returns it; a caller that reads only the verdicts it needs, or a count, does
    not pay for a record per op and per race (docs/benchmarks.md, session 7)."""

    __slots__ = (
        "_races",
        "_timeline",
        "dup_writes",
        "end_ns",
        "query_sites",
        "skipped_syncs",
        "uninit_reads",
    )

    def __init__(
        self,
        timeline: list[OpRecord] | Callable[[], list[OpRecord]] | None = None,
        races: list[Race] | Callable[[], list[Race]] | None = None,
        skipped_syncs: list[tuple[str, int]] | None = None,
        end_ns: int = 0,
        uninit_reads: list[str] | None = None,  # reads of never-written memory
        dup_writes: list[str] | None = None,  # one op writing an element twice
        query_sites: list[QuerySite] | None = None,  # branching queries, in order
    ) -> None:
        self._timeline = [] if timeline is None else timeline
        self._races = [] if races is None else races
        self.skipped_syncs = [] if skipped_syncs is None else skipped_syncs
        self.end_ns = end_ns
        self.uninit_reads = [] if uninit_reads is None else uninit_reads
        self.dup_writes = [] if dup_writes is None else dup_writes
        self.query_sites = [] if query_sites is None else query_sites

    @property
    def timeline(self) -> list[OpRecord]:
        """Every op, in issue order (built when first read, if the device deferred it)."""
        if not isinstance(self._timeline, list):
            self._timeline = list(self._timeline())
        return self._timeline

    @timeline.setter
    def timeline(self, records: list[OpRecord]) -> None:
        self._timeline = records

    @property
    def races(self) -> list[Race]:
        """Every racing pair, in the order found (built when first read, if deferred)."""
        if not isinstance(self._races, list):
            self._races = list(self._races())
        return self._races

    @races.setter
    def races(self, records: list[Race]) -> None:
        self._races = records

    def _fields(self) -> tuple:
        return (self.timeline, self.races, self.skipped_syncs, self.end_ns, self.uninit_reads,
                self.dup_writes, self.query_sites)

    def __reduce__(self) -> tuple:
        """Pickled with its records built (a builder holds its device, which does not
        travel): a run sent to another process arrives whole."""
        return (DeviceRun, self._fields())

    def __eq__(self, other: object) -> bool:
        if type(other) is not DeviceRun:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return (f"DeviceRun(timeline={self.timeline!r}, races={self.races!r}, "
                f"skipped_syncs={self.skipped_syncs!r}, end_ns={self.end_ns!r}, "
                f"uninit_reads={self.uninit_reads!r}, dup_writes={self.dup_writes!r}, "
                f"query_sites={self.query_sites!r})")
