"""One racy program and its fixed twin per rule the recorder implements (CPU mode).

Each program is plain ``torch.cuda`` code; ``summary`` turns the races the recorder found
into (kind, tensor variable, first op@stream, second op@stream) so every assertion states the
whole verdict. The fixed twin differs from the racy one by the one sync the rule is about.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from overlap_harness.recorder import watch


def summary(program: Callable[[bool], None], fixed: bool) -> list[tuple[str, ...]]:
    with watch("cpu") as watcher:
        program(fixed)
    return sorted((str(r.kind), r.buffer.split("@")[0], f"{r.first.op_name}@{r.first.agent}",
                   f"{r.second.op_name}@{r.second.agent}") for r in watcher.races)


def h2d_on_side_stream(fixed: bool) -> None:
    side = torch.cuda.Stream()
    host = torch.arange(8, dtype=torch.float32).pin_memory()
    with torch.cuda.stream(side):
        staged = host.to("cuda", non_blocking=True)
    if fixed:
        torch.cuda.current_stream().wait_stream(side)
    staged.mul(2)


def wait_on_unrecorded_event(fixed: bool) -> None:
    side = torch.cuda.Stream()
    ready = torch.cuda.Event()
    values = torch.zeros(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    if not fixed:
        torch.cuda.current_stream().wait_event(ready)  # never recorded yet: a no-op
    with torch.cuda.stream(side):
        values.fill_(3)
        ready.record()
    if fixed:
        torch.cuda.current_stream().wait_event(ready)
    values.add(1)


def copy_into_an_empty_tensor_on_a_side_stream(fixed: bool) -> None:
    """One missing wait (side on default) before a copy into a fresh ``torch.empty``: the
    allocation writes no value, so only the copy's read of ``source`` races."""
    source = torch.randn(64, device="cuda")
    out = torch.empty(64, device="cuda")
    side = torch.cuda.Stream()
    if fixed:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(source)
    torch.cuda.current_stream().wait_stream(side)
    out.sum()


def reuse_without_record_stream(fixed: bool) -> None:
    side = torch.cuda.Stream()
    scratch = torch.ones(64, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        scratch.mul(2)
    if fixed:
        scratch.record_stream(side)
    del scratch
    fresh = torch.zeros(64, device="cuda")  # same key: takes the freed block when allowed
    fresh.add_(1)


def reuse_after_sync_with_record_stream(fixed: bool) -> None:
    """record_stream and a sync: the block is reused, and the reuse is ordered."""
    side = torch.cuda.Stream()
    scratch = torch.ones(64, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        scratch.mul(2)
    scratch.record_stream(side)
    del scratch
    if fixed:
        side.synchronize()
    fresh = torch.zeros(64, device="cuda")
    fresh.add_(1)


def host_reads_pinned_before_d2h(fixed: bool) -> None:
    device = torch.arange(8, device="cuda")
    host_out = torch.empty(8, dtype=torch.int64, pin_memory=True)
    host_out.copy_(device, non_blocking=True)
    if fixed:
        torch.cuda.current_stream().synchronize()
    host_out.tolist()


def host_writes_pinned_during_h2d(fixed: bool) -> None:
    host_batch = torch.zeros(8).pin_memory()
    on_device = host_batch.to("cuda", non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    if fixed:
        done.synchronize()
    host_batch.fill_(7)
    on_device.sum()


def rows_of_one_buffer(fixed: bool) -> None:
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    table = torch.zeros(8, 4, device="cuda")
    first.wait_stream(torch.cuda.current_stream())
    second.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(first):
        table[torch.tensor([0, 1, 2], device="cuda")] = 1.0
    with torch.cuda.stream(second):
        rows = [4, 5] if fixed else [2, 3]
        table[torch.tensor(rows, device="cuda")] = 2.0


def overlapping_views(fixed: bool) -> None:
    side = torch.cuda.Stream()
    flat = torch.zeros(8, 4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flat[:, 0:2].fill_(1)
    (flat[:, 2:4] if fixed else flat[:, 1:3]).add_(1)


def single_query_vs_poll(fixed: bool) -> None:
    side = torch.cuda.Stream()
    done = torch.cuda.Event()
    result = torch.zeros(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result.fill_(3)
        done.record()
    if fixed:
        while not done.query():
            pass
    else:
        done.query()  # one probe: CPU mode answers False, which orders nothing
    result.cpu()


def blocking_item_orders_the_host(fixed: bool) -> None:
    side = torch.cuda.Stream()
    total = torch.zeros(1, device="cuda")
    host_out = torch.zeros(1).pin_memory()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        total.add_(5)
        host_out.copy_(total, non_blocking=True)
        total.item() if fixed else None  # on the side stream: blocks until the copy lands
    host_out.tolist()


def device_synchronize(fixed: bool) -> None:
    side = torch.cuda.Stream()
    out = torch.zeros(4, device="cuda")
    host_out = torch.zeros(4).pin_memory()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.fill_(2)
        host_out.copy_(out, non_blocking=True)
    if fixed:
        torch.cuda.synchronize()
    host_out.sum()


PAIRS = {
    "h2d_on_side_stream": (h2d_on_side_stream,
                           [("RAW", "staged", "_to_copy@side", "mul@default")]),
    "wait_on_unrecorded_event": (wait_on_unrecorded_event,
                                 [("RAW", "values", "fill_@side", "add@default")]),
    "copy_into_an_empty_tensor_on_a_side_stream": (
        copy_into_an_empty_tensor_on_a_side_stream,
        [("RAW", "source", "randn@default", "copy_@side")]),
    "reuse_without_record_stream": (reuse_without_record_stream,
                                    [("reuse", "scratch", "mul@side", "add_@default"),
                                     ("reuse", "scratch", "mul@side", "zeros@default")]),
    "reuse_after_sync_with_record_stream": (reuse_after_sync_with_record_stream, []),
    "host_reads_pinned_before_d2h": (host_reads_pinned_before_d2h,
                                     [("host-D2H", "host_out", "copy_@default", "tolist@host")]),
    "host_writes_pinned_during_h2d": (host_writes_pinned_during_h2d,
                                      [("host-D2H", "host_batch", "_to_copy@default",
                                        "fill_@host")]),
    "rows_of_one_buffer": (rows_of_one_buffer,
                           [("WAW", "table", "index_put_@first", "index_put_@second")]),
    "overlapping_views": (overlapping_views, [("WAW", "flat", "fill_@side", "add_@default")]),
    "single_query_vs_poll": (single_query_vs_poll,
                             [("RAW", "result", "fill_@side", "_to_copy@default")]),
    "blocking_item_orders_the_host": (blocking_item_orders_the_host,
                                      [("host-D2H", "host_out", "copy_@side", "tolist@host")]),
    "device_synchronize": (device_synchronize,
                           [("host-D2H", "host_out", "copy_@side", "sum@host")]),
}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_racy_twin_reports_exactly_its_race(name):
    program, expected = PAIRS[name]
    assert summary(program, fixed=False) == expected


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_fixed_twin_reports_no_race(name):
    program, _ = PAIRS[name]
    assert summary(program, fixed=True) == []


def test_overlapping_rows_name_only_the_shared_row():
    with watch("cpu") as watcher:
        rows_of_one_buffer(fixed=False)
    (race,) = watcher.races
    assert race.elements == (8, 9, 10, 11)  # row 2 of an (8, 4) table


def test_reuse_race_names_both_owners():
    with watch("cpu") as watcher:
        reuse_without_record_stream(fixed=False)
    owners = {(race.buffer.split("@")[0], (race.reused_as or "").split("@")[0])
              for race in watcher.races}
    assert owners == {("scratch", "fresh")}


def test_reuse_with_record_stream_but_no_sync_takes_a_fresh_block():
    with watch("cpu") as watcher:
        reuse_after_sync_with_record_stream(fixed=False)
    assert watcher.recording.pool.reused == 0
    with watch("cpu") as watcher:
        reuse_after_sync_with_record_stream(fixed=True)
    assert watcher.recording.pool.reused == 1
