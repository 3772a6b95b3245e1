"""The detector's shadow memory for short runs: the same checks as :mod:`model.shadow`, one
access at a time in numpy and Python (:class:`PerAccessShadow`).

Why two: the compiled pass of :mod:`model.shadow_kernel` checks an element in nanoseconds,
but loading it costs a process about 0.4 CPU s (numba's start-up, 0.6 s with its import),
which is more than a short run's whole detector work (a test, ``check script.py``, the bundled
suite's runs: each a few hundred to a few thousand accesses at a few microseconds each).
:class:`overlap_harness.model.detector.HBDetector` picks one per run at its first check
(:func:`use_compiled`); the rules, the pairs found and their order are the same, and the
oracle tests run both (``tests/properties/test_detector_oracle.py``).

Per memory block and agent: the op of the agent's latest write and read of every element
(-1: none), the largest clock of any of its writes and reads (an access whose clock knows
them all cannot race there, so most accesses skip the element-level check), and a log of its
accesses (epoch, op, elements, write), oldest first, walked back for the older pairs.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.shadow import MAX_AGENTS, MAX_OLDER_SCAN

LOG_PRUNE_EVERY = 64  # an agent's access log of a block is pruned when it doubles past this


class _Block:
    """One block's per-agent state (module docstring). The op arrays are agent-major, one
    row per agent registered so far, int32; a row is used through a view made on the
    agent's first access."""

    __slots__ = ("agents", "logs", "pruned_at", "r_op", "r_rows", "rmax", "w_op", "w_rows",
                 "wmax")

    def __init__(self, numel: int, agents: int) -> None:
        self.agents = agents
        self.w_op = np.full((agents, numel), -1, dtype=np.int32)
        self.r_op = np.full((agents, numel), -1, dtype=np.int32)
        self.w_rows: list[np.ndarray | None] = [None] * MAX_AGENTS
        self.r_rows: list[np.ndarray | None] = [None] * MAX_AGENTS
        self.wmax = [0] * MAX_AGENTS  # per agent, the largest clock of its writes here
        self.rmax = [0] * MAX_AGENTS
        self.logs: list[list[tuple[int, int, np.ndarray, bool]] | None] = [None] * MAX_AGENTS
        self.pruned_at = [LOG_PRUNE_EVERY] * MAX_AGENTS  # log length that triggers a prune

    def grow(self, agents: int) -> None:
        """Rows for the agents registered since the arrays were made (no access yet: -1)."""
        extra = np.full((agents - self.agents, self.w_op.shape[1]), -1, dtype=np.int32)
        self.w_op = np.concatenate([self.w_op, extra])
        self.r_op = np.concatenate([self.r_op, extra])
        self.w_rows = [None] * MAX_AGENTS  # views of the old arrays
        self.r_rows = [None] * MAX_AGENTS
        self.agents = agents


class RaceRows(list):
    """The race rows one batch of per-access checks found: :class:`model.shadow.RacingPairs`'
    reading interface over rows that are built already."""

    def rows(self) -> list[tuple]:
        """The rows themselves."""
        return self

    def named_nodes(self) -> set[int]:
        """The ops the rows name (either side)."""
        return {row[0] for row in self} | {row[1] for row in self}


class PerAccessShadow:
    """:class:`model.shadow.ShadowMemory`'s interface, checked one access at a time."""

    def __init__(self) -> None:
        self._blocks: dict[int, _Block] = {}
        self._agents = 1
        self.older_scan_truncated = 0  # older walks cut at MAX_OLDER_SCAN entries

    def add_storage(self, storage: int, numel: int) -> None:
        """State for a block's ``numel`` elements (none accessed yet)."""
        if storage not in self._blocks:
            self._blocks[storage] = _Block(numel, self._agents)

    def check(self, ops: Sequence[int], node_accesses: Sequence,
              node_clocks: Sequence[tuple[int, ...]], node_epoch: array, node_agent: array,
              n_agents: int, floor: Sequence[int]) -> list[RaceRows]:
        """:meth:`model.shadow.ShadowMemory.check`, its one batch the race rows themselves."""
        self._agents = n_agents
        epochs = np.zeros(len(node_epoch) + 1, dtype=np.int64)  # op -1 (none) reads 0
        epochs[1:] = np.frombuffer(node_epoch, dtype=np.int64)
        reachable = list(floor)
        for op in ops:  # the batch's clocks are older than the detector's now
            for agent, known in enumerate(node_clocks[op]):
                if agent < n_agents and known < reachable[agent]:
                    reachable[agent] = known
        rows = RaceRows()
        for op in ops:
            clock = node_clocks[op]
            vc = list(clock) + [0] * (n_agents - len(clock))
            agent = node_agent[op]
            for access in node_accesses[op]:
                if access[3].size:
                    self._check(op, agent, access, vc, n_agents, epochs, reachable, rows)
        return [rows] if rows else []

    def _check(self, op: int, agent: int, access: tuple, vc: list[int], n_agents: int,
               epochs: np.ndarray, floor: list[int], rows: list[tuple]) -> None:
        try:
            block = self._blocks[access[0]]
        except KeyError:
            raise DeviceUsageError(f"access to storage {access[0]} before add_storage") from None
        if block.agents < n_agents:
            block.grow(n_agents)
        try:
            self._check_block(op, agent, access, block, vc, n_agents, epochs, floor, rows)
        except IndexError:  # numpy's own bounds check, not a reduction per access
            raise DeviceUsageError(f"{access[2]!r}: element ids outside its block of "
                                   f"{block.w_op.shape[1]} elements: "
                                   f"{access[3].tolist()[:8]}") from None

    def _check_block(self, op: int, agent: int, access: tuple, block: _Block, vc: list[int],
                     n_agents: int, epochs: np.ndarray, floor: list[int],
                     rows: list[tuple]) -> None:
        elements = access[3]
        write = access[4]
        if _exceeds(block.wmax, vc, n_agents):
            self._report(op, access, block, block.w_op, vc, n_agents, epochs, True, rows)
        if write:
            if _exceeds(block.rmax, vc, n_agents):
                self._report(op, access, block, block.r_op, vc, n_agents, epochs, False, rows)
            row = block.w_rows[agent]
            if row is None:
                row = block.w_rows[agent] = block.w_op[agent]
            block.wmax[agent] = vc[agent]
        else:
            row = block.r_rows[agent]
            if row is None:
                row = block.r_rows[agent] = block.r_op[agent]
            block.rmax[agent] = vc[agent]
        row[elements] = op
        log = block.logs[agent]
        if log is None:
            log = block.logs[agent] = []
        log.append((vc[agent], op, elements, write))
        if len(log) >= block.pruned_at[agent]:
            keep = 0  # entries every agent's clock has passed can never race again
            while keep < len(log) and log[keep][0] <= floor[agent]:
                keep += 1
            del log[:keep]
            block.pruned_at[agent] = max(LOG_PRUNE_EVERY, 2 * len(log))

    def _report(self, op: int, access: tuple, block: _Block, ops: np.ndarray, vc: list[int],
                n_agents: int, epochs: np.ndarray, prior_write: bool,
                rows: list[tuple]) -> None:
        storage, buffer_id, buffer, elements, write, pinned = access
        latest = ops[:n_agents].take(elements, axis=1)  # (agents, n): latest op, or -1
        unordered = epochs[latest + 1] > np.array(vc[:n_agents])[:, None]
        if not unordered.any():
            return
        agents, positions = np.nonzero(unordered)
        pairs: dict[int, set[int]] = {}
        for prior, element in zip(latest[agents, positions].tolist(),
                                  elements[positions].tolist(), strict=True):
            pairs.setdefault(prior, set()).add(element)
        latest_ops = set(pairs)
        new_elements = set(elements.tolist())
        for other in set(agents.tolist()):
            self._older_pairs(block.logs[other] or [], vc[other], op, new_elements,
                              prior_write, pairs)
        for prior in sorted(pairs):
            rows.append((prior, op, storage, buffer_id, buffer, write, pinned,
                         tuple(sorted(pairs[prior])), prior_write, prior not in latest_ops))

    def _older_pairs(self, log: list[tuple[int, int, np.ndarray, bool]], known: int, op: int,
                     new_elements: set[int], prior_write: bool,
                     pairs: dict[int, set[int]]) -> None:
        """Add every access in ``log`` (one agent's, newest last) that is unordered with the
        new access (epoch above ``known``), of mode ``prior_write``, and shares elements with
        it. A walk of more than :data:`MAX_OLDER_SCAN` entries is cut and counted."""
        index = len(log) - 1
        scanned = 0
        while index >= 0 and log[index][0] > known:
            if scanned == MAX_OLDER_SCAN:
                self.older_scan_truncated += 1
                return
            _epoch, prior, elements, write = log[index]
            if write == prior_write and prior != op:
                common = new_elements.intersection(elements.tolist())
                if common:
                    pairs.setdefault(prior, set()).update(common)
            index -= 1
            scanned += 1


def _exceeds(largest: list[int], vc: list[int], n_agents: int) -> bool:
    """True when some agent's entry of ``largest`` is ahead of ``vc`` (an access ``vc`` does
    not know of). A plain loop: ``any()`` over a generator costs twice as much here."""
    for agent in range(n_agents):  # noqa: SIM110
        if largest[agent] > vc[agent]:
            return True
    return False
