"""The harness's block pool: the caching allocator's reuse rules, with the simulator's choice.

Why: torch's caching allocator picks the block a new tensor gets by size class and address,
and shares its blocks with every temporary a torch op allocates. A reuse race (STREAM-
SEMANTICS.md, "Caching-allocator reuse") then hands the racing block to a different owner
from trial to trial, so the wrong value the simulator predicts shows on a GPU only by chance
(s16's keep-alive mutation: 20/20 in one gated suite run, 1/20 in the next). The simulator
(``sim.device``) reuses the most recently freed block of the same numel, dtype and allocation
stream whose recorded streams are done; :class:`BlockPool` makes the same choice over real
CUDA memory.

What it keeps of the caching allocator:

- a block freed from stream S may go to the very next allocation on S: S's own pending work
  is ordered before the new owner's by stream order, nothing orders another stream's;
- after ``record_stream(T)``, not before the work T had issued when the block was freed has
  completed (an event recorded on T at the free, queried at the allocation, as torch does);
  that completion is an HB edge from T's last op (``joins``);
- pinned host blocks are not reused within a run (the simulator never recycles them).

What differs: the choice among candidates (above), and where memory comes from. Blocks stay
with the pool until the run ends, and a fresh block is allocated on a stream of the pool's
own that runs nothing but the fill a caller asks for (``fresh_stream``), so no pending work
of this run, a torch temporary's included, can touch a fresh block: a fill there that the
host waits for is in place before any stream reads it, however busy the streams are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from model.trace import OpId

BlockKey = tuple  # (numel, dtype, pinned, allocation agent): what the simulator keys reuse on


@dataclass(slots=True)
class FreedBlock:
    """A block back in the pool: its tensor, storage id, and what must complete first."""

    key: BlockKey
    tensor: Any
    storage: int
    joins: list[OpId] = field(default_factory=list)  # recorded streams' last ops at the free
    done: Sequence[Callable[[], bool]] = ()  # their completion, queried at allocation


class BlockPool:
    """Freed blocks by key, handed out most recently freed first once their recorded streams
    are done (see the module docstring). Pure bookkeeping: the caller makes the tensors and
    the completion queries, so the choice is testable without CUDA."""

    def __init__(self) -> None:
        self._free: list[FreedBlock] = []
        self._kept: list[Any] = []  # freed pinned tensors: alive as long as the pool
        self.reused = 0

    def take(self, key: BlockKey) -> FreedBlock | None:
        """The block a new buffer with ``key`` reuses, or None (allocate a fresh one)."""
        if key[2]:  # pinned: never reused
            return None
        for i in range(len(self._free) - 1, -1, -1):
            b = self._free[i]
            if b.key == key and all(q() for q in b.done):
                del self._free[i]
                self.reused += 1
                return b
        return None

    def give(self, block: FreedBlock) -> None:
        """Take a freed block back (pinned ones are only kept alive)."""
        if block.key[2]:
            self._kept.append(block.tensor)
        else:
            self._free.append(block)
