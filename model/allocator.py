"""The caching allocator's reuse rule, written once for every device.

PyTorch's caching allocator (its documented rules, STREAM-SEMANTICS.md "Caching-allocator
reuse"): a block belongs to the stream it was allocated on. Freed without ``record_stream``, it
may go to the very next allocation on that stream at once, although another stream may still
be using it: the new owner's accesses then race with the old user's (a *reuse* race). After
``record_stream(T)``, the allocator records an event on ``T`` at the free and hands the block out
only once that event has completed, which it learns by querying the event when it allocates.

That query is an *observation*: whether it says "done" depends on timing. If the model reused a
block when the clock said so (as it once did), which block went where, and so which races
exist, would depend on the timing of the run. So the rule here decides reuse by
**happens-before**: a block with recorded streams is reusable once every recorded stream's last
op at the free happens before the allocation in program order (the host synchronized it, or
waited for something ordered after it). Such a reuse needs no new edge, and it is one that every
timing allows. A real allocator may reuse the block earlier, when timing happens to let it; that
reuse is ordered by the allocator's own event, so it can never add a race of its own; it only
changes which block an allocation gets, which the real allocator decides by size and address
anyway. The choice among reusable blocks here is deterministic: the most recently freed block
of the same key (numel, dtype, pinned, allocation stream, and the private pool of the CUDA
graph capture that allocated it, if any). Pinned host blocks are never handed out again within
a run.

CUDA graph pools (STREAM-SEMANTICS.md "CUDA graphs"): a block allocated during a capture belongs
to the graph's private pool; freed, it goes back to that pool only, for a later allocation of
a capture into the same pool. Once no graph uses the pool (``reset()``, or the graph is gone),
its blocks are never handed out again within a run: PyTorch returns a released private pool's
blocks to the driver only through ``cudaFree``, which synchronizes the device.

The pool is pure bookkeeping over opaque payloads (a simulated block, a CUDA tensor): the
simulated device, the CUDA device and the recorder of real code all use it, so each makes the
same choice for the same program.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from overlap_harness.model.trace import OpId

BlockKey = tuple  # (numel, dtype, pinned, allocation agent or -1 for the host[, graph pool])


@dataclass(slots=True)
class FreedBlock:
    """A block back in the pool.

    Args:
        key: what an allocation must match to reuse it (see :data:`BlockKey`).
        payload: the device's memory behind the block (opaque here).
        storage: the block's storage id in the race detector (a reuse keeps it, which is how
            the detector tells a reuse race: same storage, another buffer).
        pending: the last op of each stream recorded with ``record_stream`` at the free; the
            block waits until every one of them happens before the allocating host.
    """

    key: BlockKey
    payload: Any
    storage: int
    pending: tuple[OpId, ...] = ()


def pending_ops(recorded: Iterable[int], owner: int | None,
                last_op: Callable[[int], OpId | None]) -> tuple[OpId, ...]:
    """What a block freed now waits for (:attr:`FreedBlock.pending`): the last op of every
    stream ``record_stream`` named, other than the allocation stream ``owner`` (torch ignores
    ``record_stream`` on the stream a block belongs to), in agent order; a stream that has
    run nothing adds nothing."""
    return tuple(op for agent in sorted(set(recorded) - {owner})
                 if (op := last_op(agent)) is not None)


class BlockPool:
    """Freed blocks, handed out most recently freed first once reusable by happens-before."""

    def __init__(self) -> None:
        # per key, its freed blocks oldest first: an allocation looks at its own key's blocks
        # only (a scan of every freed block cost each allocation of a long run more: SGLang's
        # necessity table makes 40,000 allocations over its 45 variants' runs)
        self._free: dict[BlockKey, list[FreedBlock]] = {}
        self._kept: list[Any] = []  # freed pinned payloads: alive as long as the pool
        self._released: set[object] = set()  # graph pools no graph uses any more
        self.reused = 0

    def take(self, key: BlockKey, ordered: Callable[[OpId], bool]) -> FreedBlock | None:
        """The block a new allocation with ``key`` reuses, or None (allocate a fresh one).

        ``ordered(op)`` answers whether ``op`` happens before the allocating host now (by
        program edges only; never by the clock).
        """
        if key[2]:  # pinned: never reused
            return None
        blocks = self._free.get(key)
        if not blocks:
            return None
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            if all(ordered(op) for op in block.pending):
                del blocks[index]
                self.reused += 1
                return block
        return None

    def give(self, block: FreedBlock) -> None:
        """Take a freed block back (pinned ones, and those of a released graph pool, are only
        kept alive)."""
        if block.key[2] or _graph_pool(block.key) in self._released:
            self._kept.append(block.payload)
        else:
            self._free.setdefault(block.key, []).append(block)

    def release_graph_pool(self, pool: object) -> None:
        """No graph uses the private pool ``pool`` any more: its blocks, freed now or later,
        are never handed out again (see the module docstring)."""
        self._released.add(pool)
        for key in [k for k in self._free if _graph_pool(k) == pool]:
            self._kept.extend(b.payload for b in self._free.pop(key))

    def __len__(self) -> int:
        return sum(len(blocks) for blocks in self._free.values())


def _graph_pool(key: BlockKey) -> object | None:
    """The CUDA graph pool a block key names (None: the ordinary pool)."""
    return key[4] if len(key) > 4 else None
