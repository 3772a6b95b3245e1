"""The detector's shadow memory: per memory block and element, who accessed it last, and the
batched check of queued accesses against it (:class:`ShadowMemory`).

:class:`overlap_harness.model.detector.HBDetector` queues each node's accesses as it is fed
and hands a batch here when its races are read, before it drops history, or when the queue is
long. :meth:`ShadowMemory.check` gathers the batch into flat arrays and runs the compiled pass
of :mod:`overlap_harness.model.shadow_kernel`, which checks and records every element in issue
order; the element-level hits come back grouped into racing pairs, one per (access, mode,
prior op), each with its sorted elements and whether the prior op was only an older access
(hidden behind a later one of the same agent). The pairs are in the order the per-access
checks (:mod:`overlap_harness.model.shadow_per_access`, for short runs) find them: by access,
prior writes before prior reads, then by prior op.

Layout: every block gets a range of element cells at its registration; a cell holds one entry
per agent (``stride`` of them, grown as streams are registered). Per entry, the op of the
agent's latest write and read (-1: none) and the slot of its latest access; slots (one per
element access: op, mode, the agent's previous slot of that element) are compacted when the
slot arrays would grow while most of them can no longer be reached.
"""

from __future__ import annotations

import functools
import importlib.util
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, pairwise
from types import ModuleType

import numpy as np

from overlap_harness.model.errors import DeviceUsageError

#: Older accesses walked back per element and agent, per check (a walk cut short is counted).
MAX_OLDER_SCAN = 1024
#: Agents a detector tracks at most: the host and 15 streams.
MAX_AGENTS = 16

_FIRST_STRIDE = 4  # agent entries per cell at first: the host and three streams
_FIRST_SLOTS = 1 << 12  # room for element accesses at first
# element accesses checked in one call at most: a batch's element ids are copied into one
# array (8 bytes each), and 4,096 queued nodes of 4,096-element accesses made that 268 MB
MAX_BATCH_ELEMENTS = 1 << 20
_loaded = False  # has this process run the compiled pass (paid for loading it)?


def _kernels() -> ModuleType:
    """The compiled pass's module, imported when a run first uses it: numba's import (about
    0.2 CPU s) is then paid only by a process that runs the pass."""
    from overlap_harness.model import shadow_kernel  # deferred: numba (see the docstring)

    return shadow_kernel


@dataclass(frozen=True, slots=True)
class RacingPairs:
    """The racing pairs one batch found, as arrays (one entry per pair; built into race rows
    only when read). ``access`` indexes ``accesses``, the access rows the pairs name; the
    elements of pair ``k`` are ``element_ids[element_start[k]:element_start[k + 1]]``."""

    prior: np.ndarray
    op: np.ndarray
    access: np.ndarray
    prior_write: np.ndarray
    older: np.ndarray
    element_start: np.ndarray
    element_ids: np.ndarray
    accesses: list[tuple]

    def __len__(self) -> int:
        return int(self.prior.shape[0])

    def named_nodes(self) -> set[int]:
        """The ops the pairs name (either side), without building the rows."""
        return set(self.prior.tolist()) | set(self.op.tolist())

    def rows(self) -> list[tuple]:
        """Each pair as the detector's race row: (prior op, op, storage, buffer id, buffer
        name, write, pinned, elements, prior was a write, older)."""
        ids = self.element_ids.tolist()
        bounds = self.element_start.tolist()
        accesses = self.accesses
        out = []
        for k, (prior, op, index, prior_write, older) in enumerate(zip(
                self.prior.tolist(), self.op.tolist(), self.access.tolist(),
                self.prior_write.tolist(), self.older.tolist(), strict=True)):
            storage, buffer_id, buffer, _e, write, pinned = accesses[index]
            out.append((prior, op, storage, buffer_id, buffer, write, pinned,
                        tuple(ids[bounds[k]:bounds[k + 1]]), prior_write, older))
        return out


class ShadowMemory:
    """Per-element access state of every registered block, checked in batches (module
    docstring)."""

    def __init__(self) -> None:
        self.stride = _FIRST_STRIDE
        self._base: dict[int, int] = {}  # storage -> first cell
        self._numel: dict[int, int] = {}
        # the same by storage id, for a batch's lookup in one numpy call (-1: unregistered)
        self._base_table = np.full(64, -1, dtype=np.int64)
        self._numel_table = np.zeros(64, dtype=np.int64)
        self._cells = 0  # cells handed out
        # per cell: each agent's latest write op, then its latest read op (kernel docstring)
        self.last_op = np.full(0, -1, dtype=np.int32)
        self.last_slot = np.full(0, -1, dtype=np.int32)
        self.slot_op = np.empty(_FIRST_SLOTS, dtype=np.int32)
        self.slot_prev = np.empty(_FIRST_SLOTS, dtype=np.int32)
        self.slot_write = np.empty(_FIRST_SLOTS, dtype=np.bool_)
        self.slot_count = 0
        self.compactions = 0  # times the unreachable slots were dropped
        self.older_scan_truncated = 0  # older walks cut at MAX_OLDER_SCAN entries

    # -- layout ---------------------------------------------------------------------------
    def add_storage(self, storage: int, numel: int) -> None:
        """Cells for a block's ``numel`` elements (none accessed yet)."""
        if storage in self._base:
            return
        self._base[storage] = self._cells
        self._numel[storage] = numel
        if storage >= self._base_table.shape[0]:
            size = max(storage + 1, 2 * self._base_table.shape[0])
            self._base_table = _extended(self._base_table, size)
            self._numel_table = np.concatenate(
                [self._numel_table, np.zeros(size - self._numel_table.shape[0], np.int64)])
        self._base_table[storage] = self._cells
        self._numel_table[storage] = numel
        self._cells += numel
        need = self._cells * self.stride
        if need > self.last_slot.shape[0]:
            size = max(need, 2 * self.last_slot.shape[0], 1 << 14)
            self.last_op = _extended(self.last_op, 2 * size)
            self.last_slot = _extended(self.last_slot, size)

    def ensure_agents(self, n_agents: int) -> None:
        """Room in every cell for ``n_agents`` agents (the entries of existing cells move)."""
        if n_agents <= self.stride:
            return
        new_stride = self.stride
        while new_stride < n_agents:
            new_stride *= 2
        self.last_op = _restrided(self.last_op, self.stride, new_stride, groups=2)
        self.last_slot = _restrided(self.last_slot, self.stride, new_stride)
        self.stride = new_stride

    # -- the check ------------------------------------------------------------------------
    def check(self, ops: Sequence[int], node_accesses: Sequence,
              node_clocks: Sequence[tuple[int, ...]], node_epoch: array, node_agent: array,
              n_agents: int, floor: Sequence[int]) -> list[RacingPairs]:
        """Check the accesses of nodes ``ops`` (in issue order; each has at least one access),
        recording them; returns the racing pairs found, one batch of them per call of the
        compiled pass (a batch of more than :data:`MAX_BATCH_ELEMENTS` element accesses is
        checked in parts, each a run of whole nodes). ``node_accesses``,
        ``node_clocks``, ``node_epoch`` and ``node_agent`` are the detector's per-node
        tables; ``floor`` (per agent, the least entry any agent's clock has of it) lets the
        slots no walk can reach be dropped."""
        per_node = [node_accesses[op] for op in ops]
        accesses = [acc for row in per_node for acc in row]
        if not accesses:
            return []
        node_index = np.repeat(np.arange(len(ops), dtype=np.int64),
                               [len(row) for row in per_node])
        storages, _ids, _names, arrays, write_flags, _pinned = zip(*accesses, strict=True)
        sizes = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        if len(ops) > 1 and int(sizes.sum()) > MAX_BATCH_ELEMENTS:
            node_elements = np.bincount(node_index, weights=sizes, minlength=len(ops))
            part = np.cumsum(node_elements) // MAX_BATCH_ELEMENTS
            cuts = [0, *(np.flatnonzero(np.diff(part)) + 1).tolist(), len(ops)]
            found: list[RacingPairs] = []
            for start, end in pairwise(cuts):
                found += self.check(ops[start:end], node_accesses, node_clocks, node_epoch,
                                    node_agent, n_agents, floor)
            return found
        if not sizes.all():  # an access of no element checks nothing
            keep = np.flatnonzero(sizes)
            if not keep.shape[0]:
                return []
            accesses = [accesses[k] for k in keep.tolist()]
            storages, _ids, _names, arrays, write_flags, _pinned = zip(*accesses, strict=True)
            node_index, sizes = node_index[keep], sizes[keep]
        self.ensure_agents(n_agents)
        bounds = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(sizes, out=bounds[1:])
        elements = np.concatenate(arrays).astype(np.int64, copy=False)
        storage_ids = np.fromiter(storages, dtype=np.int64, count=len(storages))
        known = (storage_ids >= 0) & (storage_ids < self._base_table.shape[0])
        base = np.where(known, self._base_table[np.where(known, storage_ids, 0)], -1)
        if (base < 0).any():
            missing = storage_ids[np.flatnonzero(base < 0)[0]]
            raise DeviceUsageError(f"access to storage {missing} before add_storage")
        numel = self._numel_table[storage_ids]
        writes = np.array(write_flags, dtype=np.bool_)
        op_ids = np.asarray(ops, dtype=np.int64)
        acc_op = op_ids[node_index]
        clocks = _clock_matrix([node_clocks[op] for op in ops], self.stride)
        # the batch's own clocks are older than the detector's now: no slot a check of this
        # batch can reach may go
        reachable = np.minimum(np.asarray(floor, dtype=np.int64), clocks[:, :n_agents].min(axis=0))
        self._make_room(int(bounds[-1]), node_epoch, node_agent, reachable)
        epoch = np.frombuffer(node_epoch, dtype=np.int64)
        agent_of = np.frombuffer(node_agent, dtype=np.int8)[op_ids].astype(np.int64)
        try:
            hits, self.slot_count, truncated, bad = _kernels().check_batch(
                acc_op, agent_of[node_index], base, numel, writes,
                bounds[:-1], bounds[1:], elements, clocks[node_index], n_agents, self.stride,
                epoch, self.last_op, self.last_slot, self.slot_op,
                self.slot_prev, self.slot_write, self.slot_count, MAX_OLDER_SCAN)
        finally:
            del epoch  # the view pins node_epoch's buffer: let it grow again
        global _loaded
        _loaded = True
        self.older_scan_truncated += int(truncated)
        if bad >= 0:
            storage, _id, buffer, e, _write, _pinned = accesses[bad]
            raise DeviceUsageError(f"{buffer!r}: element ids outside its block of "
                                   f"{self._numel[storage]} elements: {e.tolist()[:8]}")
        if not hits.shape[0]:
            return []
        return [_pairs(hits, acc_op, accesses)]

    def _make_room(self, new_slots: int, node_epoch: array, node_agent: array,
                   floor: np.ndarray) -> None:
        """Room for ``new_slots`` more slots: drop the unreachable ones first when that frees
        at least half, else grow."""
        need = self.slot_count + new_slots
        if need <= self.slot_op.shape[0]:
            return
        if self.slot_count:
            epoch = np.frombuffer(node_epoch, dtype=np.int64)
            op_agent = np.frombuffer(node_agent, dtype=np.int8)
            try:
                self.slot_count = _kernels().compact_slots(
                    self.last_slot, self.slot_op, self.slot_prev, self.slot_write,
                    self.slot_count, epoch, op_agent, floor)
            finally:
                del epoch, op_agent  # the views pin the tables' buffers
            self.compactions += 1
            need = self.slot_count + new_slots
            if 2 * need <= self.slot_op.shape[0]:
                return
        size = max(need, 2 * self.slot_op.shape[0])
        self.slot_op = _resized(self.slot_op, size, self.slot_count)
        self.slot_prev = _resized(self.slot_prev, size, self.slot_count)
        self.slot_write = _resized(self.slot_write, size, self.slot_count)


def _pairs(hits: np.ndarray, acc_op: np.ndarray, accesses: list[tuple]) -> RacingPairs:
    """Group element hits (rows of access, mode, prior op, element, latest) into racing
    pairs: by (access, mode, prior op), elements sorted and unique; a pair is ``older`` when
    none of its hits was the prior agent's latest."""
    order = np.lexsort((hits[:, 3], hits[:, 2], hits[:, 1], hits[:, 0]))
    acc, mode, prior, element, latest = hits[order].T
    n = acc.shape[0]
    new_group = np.ones(n, dtype=np.bool_)
    new_group[1:] = (acc[1:] != acc[:-1]) | (mode[1:] != mode[:-1]) | (prior[1:] != prior[:-1])
    keep = new_group.copy()
    keep[1:] |= element[1:] != element[:-1]  # one entry per element of a pair
    starts = np.flatnonzero(new_group)
    # a pair is latest when any hit of it is; its elements are the kept ones in its group
    group_of = np.cumsum(new_group) - 1
    any_latest = np.add.reduceat(latest, starts) > 0
    kept_group = group_of[keep]
    element_start = np.searchsorted(kept_group, np.arange(starts.shape[0] + 1))
    # only the access rows the pairs name are kept (a batch has tens of thousands)
    named, access = np.unique(acc[starts], return_inverse=True)
    return RacingPairs(prior[starts], acc_op[acc[starts]], access, mode[starts] == 0,
                       ~any_latest, element_start, element[keep],
                       [accesses[k] for k in named.tolist()])


def _clock_matrix(clocks: list[tuple[int, ...]], width: int) -> np.ndarray:
    """Node clocks (tuples over the agents registered when each node ran; agents are only
    ever added, so the lengths never shrink) as rows of ``width`` entries, 0 for agents
    registered later."""
    matrix = np.zeros((len(clocks), width), dtype=np.int64)
    agents = len(clocks[0])
    if agents == len(clocks[-1]):  # one width: flattened at C speed, not tuple by tuple
        matrix[:, :agents] = np.fromiter(chain.from_iterable(clocks), dtype=np.int64,
                                         count=len(clocks) * agents).reshape(-1, agents)
        return matrix
    for row, clock in enumerate(clocks):
        matrix[row, :len(clock)] = clock
    return matrix


def _extended(cells: np.ndarray, size: int) -> np.ndarray:
    """``cells`` with room for ``size`` entries, the new ones -1."""
    bigger = np.full(size, -1, dtype=cells.dtype)
    bigger[:cells.shape[0]] = cells
    return bigger


def _restrided(cells: np.ndarray, old: int, new: int, groups: int = 1) -> np.ndarray:
    """Cells of ``groups`` runs of ``old`` entries each, re-laid as runs of ``new`` entries
    (the added ones -1)."""
    n_cells = cells.shape[0] // (groups * old)
    out = np.full((n_cells, groups, new), -1, dtype=cells.dtype)
    out[:, :, :old] = cells[:n_cells * groups * old].reshape(n_cells, groups, old)
    return out.reshape(-1)


def _resized(values: np.ndarray, size: int, used: int) -> np.ndarray:
    bigger = np.empty(size, dtype=values.dtype)
    bigger[:used] = values[:used]
    return bigger


def compiled_loaded() -> bool:
    """Has this process loaded the compiled pass already (so using it costs nothing more)?"""
    return _loaded


@functools.cache
def compiled_available() -> bool:
    """Is numba installed? Without it every run checks one access at a time (the same
    races, slower on long runs)."""
    return importlib.util.find_spec("numba") is not None


def warm_up() -> None:
    """Load (or compile, the first time on a machine) the compiled pass: about 0.4 CPU s
    when cached. A process about to fork workers calls this first, so they inherit it
    instead of each paying it."""
    detector_like = ShadowMemory()
    detector_like.add_storage(0, 4)
    epochs = array("q", [1, 1])
    agents = array("b", [1, 2])
    no_access = (0, 0, "warm", np.zeros(0, dtype=np.int64), True, False)
    for op, element in ((0, 1), (1, 1)):
        access = (0, 0, "warm", np.array([element], dtype=np.int64), True, False)
        detector_like.check([op], {op: (access, no_access)}, {op: (0, 1, 1)}, epochs, agents,
                            3, [0, 0, 0])
    detector_like._make_room(detector_like.slot_op.shape[0], epochs, agents,
                             np.zeros(3, dtype=np.int64))
