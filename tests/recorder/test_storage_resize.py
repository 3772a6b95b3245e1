"""Storage resizes as frees, allocations and moves (STREAM-SEMANTICS.md "Storage resizes"),
and the other ways memory changes hands: ``set_``, ``Tensor.resize_``, ``empty_like``. Every
verdict is the detector's; every racy case has its twin with the sync restored."""

from __future__ import annotations

import pytest
import torch

from overlap_harness.model.trace import RaceKind
from overlap_harness.recorder import watch


def _free_then_reuse(free: str, record_stream: bool) -> list[str]:
    """A side stream reads ``bucket``; the host frees it (``free``) and allocates again on the
    default stream: the race kinds found."""
    with watch("cpu") as w:
        out = torch.zeros(64, device="cuda")
        bucket = torch.full((64,), 5.0, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.copy_(bucket)
        if record_stream:
            bucket.record_stream(side)
        if free == "del":
            del bucket
            fresh = torch.empty_like(out)
        elif free == "storage":
            bucket.storage().resize_(0)
            fresh = torch.empty_like(out)
        else:
            bucket.untyped_storage().resize_(0)
            fresh = torch.empty_like(out)
        fresh.fill_(-1.0)
    return sorted(str(r.kind) for r in w.races)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("free", ["del", "untyped", "storage"])
def test_a_resize_to_zero_frees_the_block_as_del_does(free: str) -> None:
    # the new owner's first write races the side stream's read (the allocation itself
    # writes no value: one race, not two)
    assert _free_then_reuse(free, record_stream=False) == [str(RaceKind.REUSE)]
    assert _free_then_reuse(free, record_stream=True) == []


def test_growing_an_emptied_storage_allocates_on_the_current_stream() -> None:
    with watch("cpu") as w:
        out = torch.zeros(64, device="cuda")
        bucket = torch.full((64,), 5.0, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.copy_(bucket)
        nbytes = bucket.untyped_storage().nbytes()
        bucket.untyped_storage().resize_(0)
        with torch.cuda.stream(side):  # a block of the side stream: the default's stays free
            bucket.untyped_storage().resize_(nbytes)
            bucket.fill_(1.0)
        info = w.memory.lookup(bucket)
        side_agent = side.agent
    assert info is not None and info.alloc_agent == side_agent
    assert info.name.startswith("bucket@")
    assert w.races == []


@pytest.mark.parametrize("ordered", [False, True])
def test_a_storage_moved_by_a_resize_is_followed(ordered: bool) -> None:
    # Tensor.resize_ growing a storage moves it (an aten op: the dispatcher sees the move);
    # the side stream's write of the moved storage races the default stream's read unless
    # ordered.
    with watch("cpu") as w:
        buf = torch.zeros(8, device="cuda")
        buf.resize_(4096)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf[100:200].fill_(3.0)
        if ordered:
            torch.cuda.current_stream().wait_stream(side)
        total = buf[150:160].sum()
    assert total.item() == 30.0
    assert [str(r.kind) for r in w.races] == ([] if ordered else [str(RaceKind.RAW)])


@pytest.mark.parametrize("ordered", [False, True])
def test_the_copy_of_a_storage_resize_reads_the_old_block(ordered: bool) -> None:
    with watch("cpu") as w:
        buf = torch.zeros(16, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            buf.fill_(2.0)
        if ordered:
            torch.cuda.current_stream().wait_stream(side)
        buf.untyped_storage().resize_(buf.untyped_storage().nbytes() * 2)  # moves: a copy
    assert [str(r.kind) for r in w.races] == ([] if ordered else [str(RaceKind.RAW)])


@pytest.mark.parametrize("ordered", [False, True])
def test_set_views_the_source_storage_without_touching_memory(ordered: bool) -> None:
    with watch("cpu") as w:
        src = torch.zeros(32, device="cuda")
        alias = torch.empty(0, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            alias.set_(src.untyped_storage(), 8, (8,))
            alias.fill_(1.0)
        if ordered:
            torch.cuda.current_stream().wait_stream(side)
        head, tail = src[:8].sum(), src[8:16].sum()
    assert (head.item(), tail.item()) == (0.0, 8.0)
    races = w.races
    assert [str(r.kind) for r in races] == ([] if ordered else [str(RaceKind.RAW)])
    assert all(set(r.elements) <= set(range(8, 16)) for r in races)


@pytest.mark.parametrize("ordered", [False, True])
def test_an_empty_device_tensor_grown_is_device_memory(ordered: bool) -> None:
    with watch("cpu") as w:
        bucket = torch.empty(0, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            bucket.untyped_storage().resize_(64 * 4)
            bucket.set_(bucket.untyped_storage(), 0, (64,))
            bucket.fill_(1.0)
        if ordered:
            torch.cuda.current_stream().wait_stream(side)
        total = bucket.sum()
    assert total.item() == 64.0
    assert [str(r.kind) for r in w.races] == ([] if ordered else [str(RaceKind.RAW)])
    assert all(r.buffer.startswith("bucket@") for r in w.races)
