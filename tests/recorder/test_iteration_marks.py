"""``Watch.iteration(i)`` marks the ops issued after it (timeline and races name the loop
iteration), and ``Tensor.to(..., copy=True)`` works on faked device memory (CPU mode)."""

from __future__ import annotations

import torch

import overlap_harness.recorder as recorder


def _loop(watch, iterations, *, wait):
    side = torch.cuda.Stream()
    data = torch.zeros(4, device="cuda")
    if wait:
        side.wait_stream(torch.cuda.current_stream())
    for index in range(iterations):
        watch.iteration(index)
        with torch.cuda.stream(side):
            data.add_(1)  # without the wait, races with the default stream's zeros


def test_races_and_timeline_name_the_marked_iteration():
    with recorder.watch(mode="cpu") as watch:
        _loop(watch, 2, wait=False)
        torch.cuda.synchronize()
    assert {op.iteration for op in watch.run.timeline if op.name == "add_"} == {0, 1}
    assert [(r.first.iteration, r.second.iteration) for r in watch.races] == [(-1, 0), (-1, 1)]


def test_the_twin_with_the_wait_is_race_free():
    with recorder.watch(mode="cpu") as watch:
        _loop(watch, 2, wait=True)
        torch.cuda.synchronize()
    assert watch.races == []


def test_before_any_mark_ops_are_iteration_minus_one():
    with recorder.watch(mode="cpu") as watch:
        data = torch.zeros(4, device="cuda")
        data.add_(1)
        torch.cuda.synchronize()
    assert {op.iteration for op in watch.run.timeline} == {-1}


def test_to_with_copy_on_device_memory():
    with recorder.watch(mode="cpu") as watch:
        data = torch.arange(4, device="cuda", dtype=torch.int32)
        copied = data[:3].to(dtype=torch.int64, copy=True)
        torch.cuda.synchronize()
    assert copied.tolist() == [0, 1, 2]
    assert copied.dtype == torch.int64
    assert watch.races == []
