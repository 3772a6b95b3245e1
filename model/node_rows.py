"""The records and tables of the detector's nodes: what a node is (:class:`NodeInfo`, or the
plain :data:`NodeRow` the simulator feeds), what it accessed (:class:`AccessReq`, or the plain
:data:`AccessRow`), and the per-node tables that keep them as plain tuples and build records
only when read (:class:`NodeTable`, :class:`NodeAccesses`). Split from
:mod:`overlap_harness.model.detector`, which re-exports these names."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, overload

import numpy as np

from overlap_harness.model.trace import OP_KIND_INDEX, OP_KINDS, OpId, OpKind


@dataclass(slots=True)
class NodeInfo:
    """What the detector remembers of one node (op) to report it later."""

    op: OpId
    name: str
    agent: int
    agent_name: str
    kind: OpKind
    iteration: int
    source: str
    label: str | None
    start_ns: int | None
    end_ns: int | None


class AccessReq(NamedTuple):
    """One declared access of a node: storage block, buffer identity, elements, mode.

    A named tuple: one is built per access of every op, and a frozen dataclass's
    ``__init__`` (one ``object.__setattr__`` per field) cost four times as much."""

    storage: int
    buffer_id: int
    buffer: str
    elements: np.ndarray
    write: bool
    pinned: bool = False


#: An :class:`AccessReq`'s fields, in order, as a plain tuple (what the detector keeps).
AccessRow = tuple[int, int, str, np.ndarray, bool, bool]
_Fields = AccessRow
#: A :class:`NodeInfo`'s fields as a plain tuple, the op kind as its index in ``OP_KINDS``:
#: (op, name, agent, agent_name, kind index, iteration, source, label, start_ns, end_ns).
NodeRow = tuple[int, str, int, str, int, int, str, "str | None", "int | None", "int | None"]


class NodeAccesses(Sequence[Sequence[AccessReq]]):
    """Every node's accesses as declared, by node id (:attr:`HBDetector.node_accesses`).

    Kept as plain tuples of each access's fields and handed out as :class:`AccessReq`
    records again when read. A run keeps one entry per node for good; a plain tuple of ints,
    strings and numpy arrays is untracked by Python's cyclic GC (a dataclass instance never
    is), and full collections, whose cost grows with every tracked object, were the largest
    single cost of a long simulated run.
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[tuple[_Fields, ...]] = []

    def append(self, accesses: Sequence[AccessReq]) -> None:
        """Keep one node's accesses (the next node id)."""
        self._rows.append(tuple([tuple(a) for a in accesses]))

    def rows(self, i: int) -> tuple[_Fields, ...]:
        """Node ``i``'s accesses as plain field tuples (no records built)."""
        return self._rows[i]

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> tuple[AccessReq, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> list[tuple[AccessReq, ...]]: ...

    def __getitem__(self, i: int | slice) -> tuple[AccessReq, ...] | list[tuple[AccessReq, ...]]:
        if isinstance(i, slice):
            return [tuple([AccessReq(*f) for f in row]) for row in self._rows[i]]
        return tuple([AccessReq(*f) for f in self._rows[i]])


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a batch of acyclic records is built
    (the races or the timeline of a long run, all at once): the collector can free nothing
    there, yet the burst of new tracked objects set off full collections, each a walk over
    every object of the process (three of them for 50,000 ops of ``sim_throughput``). The
    previous state is restored on the way out."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()




class NodeTable(Sequence[NodeInfo]):
    """Every node the detector was fed, by node id (:attr:`HBDetector.nodes`).

    Kept as plain tuples of ints and strings (the op kind as its index in :class:`OpKind`)
    and handed out as :class:`NodeInfo` records again when read: an enum member or a
    dataclass instance keeps a record tracked by Python's cyclic GC for good, and full
    collections over one tracked record per op cost about a quarter of a long run's CPU
    (``benchmarks/sim_throughput.py``, docs/benchmarks.md).
    """

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: list[tuple] = []

    def append(self, info: NodeInfo) -> None:
        """Keep one node (the next node id)."""
        self._rows.append(node_row(info))

    def row(self, op: int) -> NodeRow:
        """Node ``op`` as its plain :data:`NodeRow` (no record built)."""
        return self._rows[op]

    def rows_since(self, start: int) -> list[NodeRow]:
        """The plain rows of nodes ``start`` onwards."""
        return self._rows[start:]

    def agent(self, op: int) -> int:
        """The agent of node ``op``, without building its record."""
        return self._rows[op][2]

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> NodeInfo: ...

    @overload
    def __getitem__(self, i: slice) -> list[NodeInfo]: ...

    def __getitem__(self, i: int | slice) -> NodeInfo | list[NodeInfo]:
        if isinstance(i, slice):
            return [node_info(row) for row in self._rows[i]]
        return node_info(self._rows[i])


def node_row(info: NodeInfo) -> NodeRow:
    """``info`` as the plain row the tables keep."""
    return (info.op, info.name, info.agent, info.agent_name, OP_KIND_INDEX[info.kind],
            info.iteration, info.source, info.label, info.start_ns, info.end_ns)


def node_info(row: tuple) -> NodeInfo:
    """A kept row as its :class:`NodeInfo` record again."""
    op, name, agent, agent_name, kind, iteration, source, label, start, end = row
    return NodeInfo(op, name, agent, agent_name, OP_KINDS[kind], iteration, source, label, start,
                    end)
