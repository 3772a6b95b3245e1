"""The simulator's fast paths against the plain computations they stand for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.model.detector import AccessReq, HBDetector, NodeInfo
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.trace import HOST, OpKind
from overlap_harness.sim.block_tracking import access_rows
from overlap_harness.sim.op_values import RepeatCheck, may_repeat, repeats
from overlap_harness.sim.sim_device import SimDevice


def test_node_accesses_hand_back_the_declared_accesses() -> None:
    det = HBDetector()
    det.add_storage(0, 8, (8,))
    accs = [AccessReq(0, 3, "b", np.array([1, 2]), True, True),
            AccessReq(0, 3, "b", np.array([5]), False)]
    det.on_op(NodeInfo(0, "w", 0, HOST, OpKind.HOST_WRITE, -1, "", None, 0, 0), accs)
    det.on_op(NodeInfo(1, "s", 0, HOST, OpKind.HOST_SYNC, -1, "", None, 0, 0))
    assert len(det.node_accesses) == 2
    got = det.node_accesses[0]
    assert [(a.storage, a.buffer_id, a.buffer, a.elements.tolist(), a.write, a.pinned)
            for a in got] == [(0, 3, "b", [1, 2], True, True), (0, 3, "b", [5], False, False)]
    assert det.node_accesses[1] == ()
    assert [len(x) for x in det.node_accesses] == [2, 0]
    assert [len(x) for x in det.node_accesses[0:2]] == [2, 0]


def test_repeat_check_agrees_with_unique() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 5, 64, 256, 257, 1000):
        for _ in range(20):
            e = rng.integers(0, max(1, 2 * n), n)
            assert repeats(e) == (np.unique(e).size != e.size)
    assert not may_repeat(None) and not may_repeat(3) and not may_repeat(slice(0, 4))
    assert not may_repeat((1, slice(None)))
    assert may_repeat([1, 1]) and may_repeat(np.array([0])) and may_repeat((0, [1, 1]))


def test_linear_repeat_check_agrees_with_unique() -> None:
    rng = np.random.default_rng(1)
    check = RepeatCheck()
    check.reserve(64)
    check.reserve(8)  # a smaller block later keeps the room
    for n in (0, 1, 2, 16, 17, 40, 64):
        for _ in range(50):
            e = rng.integers(0, 64, n)  # ids of a 64-element block, repeats likely
            assert check.check(e) == (np.unique(e).size != e.size), e
            distinct = rng.permutation(64)[:n]
            assert not check.check(distinct), distinct
    check.reserve(5000)
    assert check.check(np.arange(4990, 5000)) is False and check.check(np.array([4999] * 20))


def test_whole_block_flags_reset_when_the_block_is_reused() -> None:
    dev = SimDevice()
    s = dev.stream("s")
    a = dev.buffer("a", (4,), torch.int64, stream=s, fill=0)
    dev.free(a)
    b = dev.buffer("b", (4,), torch.int64, stream=s)  # same block, nothing written by b
    assert b.storage == a.storage
    dev.launch(s, "k", lambda v: v[:2], reads=[b], writes=[(b, [0, 0])])
    run = dev.finish()
    assert run.uninit_reads == ["k@-1 reads never-written elements of b"]
    assert run.dup_writes == ["k@-1 writes some elements of b twice in one op "
                              "(order device-defined)"]


def test_long_writes_are_checked_past_the_kept_positions() -> None:
    check = RepeatCheck()
    check.reserve(5000)
    ids = np.random.default_rng(2).permutation(5000)
    for n in (9, 1024, 1025, 3000):  # kept position views, then sliced ones
        assert not check.check(ids[:n])
        assert check.check(np.concatenate([ids[:n - 1], ids[n // 2: n // 2 + 1]]))


def test_access_rows_give_the_flat_ids_and_refuse_a_freed_buffer() -> None:
    dev = SimDevice()
    flat = dev.buffer("flat", (10,), torch.int64, fill=0)
    grid = dev.buffer("grid", (3, 4), torch.int64, fill=0)
    specs = [flat, (flat, None), (flat, np.array([2, -1, 2])), (flat, [7, 0]),
             (flat, slice(1, 4)), (grid, np.array([2, 0])), (grid, 1), (grid, (0, slice(1, 3)))]
    pairs, rows = access_rows(specs, True)
    assert pairs[0] == (flat, None) and pairs[2] is specs[2]
    # by hand: a grid row r is elements 4r..4r+3; negative ids count from the end
    expected = [list(range(10)), list(range(10)), [2, 9, 2], [7, 0], [1, 2, 3],
                [8, 9, 10, 11, 0, 1, 2, 3], [4, 5, 6, 7], [1, 2]]
    assert [row[3].tolist() for row in rows] == expected
    assert [row[:3] + row[4:] for row in rows] == \
        [(flat.storage, flat.id, "flat", True, False)] * 5 + \
        [(grid.storage, grid.id, "grid", True, False)] * 3
    index = np.array([1, 2])
    (_pair,), (row,) = access_rows([(flat, index)], False)
    index[0] = 5  # the caller changes its array after the launch: the row keeps its own
    assert row[3].tolist() == [1, 2] and row[4] is False
    dev.free(flat)
    with pytest.raises(DeviceUsageError, match="access to freed buffer 'flat'"):
        access_rows([(flat, [0])], False)
