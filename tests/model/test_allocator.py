"""The one block pool (model/allocator.py): the caching allocator's reuse rule decided by
happens-before, the same choice on every device."""

from __future__ import annotations

import torch

from overlap_harness.model.allocator import BlockPool, FreedBlock
from overlap_harness.model.trace import OpId

I64 = torch.int64


def key(numel: int = 4, dtype: torch.dtype = I64, pinned: bool = False, agent: int = 0):
    return (numel, dtype, pinned, agent)


def always(_op: OpId) -> bool:
    return True


def test_most_recently_freed_block_of_the_same_key_goes_first() -> None:
    pool = BlockPool()
    for storage in (1, 2, 3):
        pool.give(FreedBlock(key(), f"t{storage}", storage))
    pool.give(FreedBlock(key(agent=1), "other stream", 4))
    pool.give(FreedBlock(key(numel=8), "bigger", 5))
    assert [pool.take(key(), always).storage for _ in range(3)] == [3, 2, 1]
    assert pool.take(key(), always) is None and pool.reused == 3
    assert len(pool) == 2


def test_a_recorded_block_waits_until_its_streams_happen_before_the_host() -> None:
    ordered: set[OpId] = set()
    pool = BlockPool()
    pool.give(FreedBlock(key(), "old", 1))
    pool.give(FreedBlock(key(), "recorded", 2, pending=(OpId(7), OpId(9))))
    first = pool.take(key(), ordered.__contains__)
    assert first is not None and first.storage == 1  # the pending one is passed over
    ordered.add(OpId(7))
    assert pool.take(key(), ordered.__contains__) is None  # one recorded stream is not enough
    ordered.add(OpId(9))
    later = pool.take(key(), ordered.__contains__)
    assert later is not None and later.storage == 2 and later.payload == "recorded"


def test_pinned_blocks_are_never_handed_out_again() -> None:
    pool = BlockPool()
    pool.give(FreedBlock(key(pinned=True, agent=-1), "pinned", 1))
    assert pool.take(key(pinned=True, agent=-1), always) is None
    assert len(pool) == 0
