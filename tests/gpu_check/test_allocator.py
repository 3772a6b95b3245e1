"""BlockPool's choice of block is the simulator's: most recently freed first, same numel,
dtype and allocation stream, not before the recorded streams are done; pinned never reused."""

from __future__ import annotations

import torch

from gpu_check.allocator import BlockPool, FreedBlock
from model.trace import OpId

I64 = torch.int64


def key(numel: int = 4, dtype: torch.dtype = I64, pinned: bool = False, agent: int = 0):
    return (numel, dtype, pinned, agent)


def test_most_recently_freed_block_of_the_same_key_goes_first() -> None:
    pool = BlockPool()
    for storage in (1, 2, 3):
        pool.give(FreedBlock(key(), f"t{storage}", storage))
    pool.give(FreedBlock(key(agent=1), "other stream", 4))
    pool.give(FreedBlock(key(numel=8), "bigger", 5))
    assert [pool.take(key()).storage for _ in range(3)] == [3, 2, 1]
    assert pool.take(key()) is None and pool.reused == 3


def test_a_block_waits_for_its_recorded_streams_and_brings_their_joins() -> None:
    pool, done = BlockPool(), [False]
    pool.give(FreedBlock(key(), "old", 1))
    pool.give(FreedBlock(key(), "recorded", 2, joins=[OpId(7)], done=[lambda: done[0]]))
    first = pool.take(key())
    assert first is not None and first.storage == 1  # the pending one is passed over
    assert pool.take(key()) is None
    done[0] = True
    later = pool.take(key())
    assert later is not None and later.storage == 2 and later.joins == [OpId(7)]


def test_pinned_blocks_are_never_handed_out_again() -> None:
    pool = BlockPool()
    pool.give(FreedBlock(key(pinned=True, agent=-1), "pinned", 1))
    assert pool.take(key(pinned=True, agent=-1)) is None
