"""Syncs a program makes without naming one, and syncs the recorder makes for itself.

An op whose output size depends on device values (``nonzero``, ``masked_select``, a bool-mask
index, ``unique``, ``repeat_interleave`` without ``output_size``) makes the host wait for its
stream on a GPU; CPU mode must order the host the same way, or it reports races a GPU run
cannot have. The recorder's own host reads of index tensors, by contrast, are not the
program's: on a GPU they fire the trace hooks as stream syncs, which GPU mode must ignore.
Each racy program has a fixed twin that differs by the one op the rule is about.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from overlap_harness.recorder import gpu_mode, watch
from overlap_harness.recorder.own_work import in_recorder_work, recorder_work


def races(program: Callable[[bool], None], fixed: bool,
          mode: str = "cpu") -> list[tuple[str, str, str, str]]:
    """(kind, variable, first op@stream, second op@stream) of each race ``program`` has."""
    with watch(mode) as watcher:
        program(fixed)
        if mode == "gpu":
            torch.cuda.synchronize()
    return sorted((str(r.kind), r.buffer.split("@")[0], f"{r.first.op_name}@{r.first.agent}",
                   f"{r.second.op_name}@{r.second.agent}") for r in watcher.races)


def _side_write_then_host_write(value_shaped: Callable[[torch.Tensor], object]):
    def program(fixed: bool) -> None:
        side = torch.cuda.Stream()
        mask = torch.tensor([True, False, True, True], device="cuda")
        host_out = torch.zeros(4).pin_memory()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host_out.copy_(mask.to(torch.float32), non_blocking=True)
            if fixed:  # the host waits for ``side`` to finish this op, so for the copy too
                value_shaped(mask)
        host_out.fill_(0.5)
    return program


SHAPED_BY_VALUES = {
    "nonzero": lambda mask: mask.nonzero(),
    "masked_select": lambda mask: torch.masked_select(mask, mask),
    "bool_mask_index": lambda mask: mask[mask],
    "unique": lambda mask: torch.unique(mask.to(torch.int64)),
    "repeat_interleave": lambda mask: torch.repeat_interleave(mask.to(torch.int64)),
    # host data made a device tensor: a blocking copy from pageable memory on the stream
    "tensor_from_host_data": lambda mask: torch.tensor([1, 2], device="cuda"),
    "new_tensor_from_host_data": lambda mask: mask.new_tensor([1, 0]),
}


@pytest.mark.parametrize("name", sorted(SHAPED_BY_VALUES))
def test_an_op_shaped_by_device_values_orders_the_host_after_its_stream(name):
    program = _side_write_then_host_write(SHAPED_BY_VALUES[name])
    assert races(program, fixed=False) == [("host-D2H", "host_out", "copy_@side", "fill_@host")]
    assert races(program, fixed=True) == []


def test_repeat_interleave_with_output_size_does_not_sync():
    program = _side_write_then_host_write(
        lambda mask: torch.repeat_interleave(mask.to(torch.int64), output_size=3))
    assert races(program, fixed=True) == [("host-D2H", "host_out", "copy_@side", "fill_@host")]


class _StrictRecording:
    """Takes the one call the test plans (``sync_device``) and counts it; nothing else."""

    def __init__(self) -> None:
        self.device_syncs = 0

    def sync_device(self) -> None:
        self.device_syncs += 1


class _Memory:
    def __init__(self) -> None:
        self.recording = _StrictRecording()


def test_trace_hooks_ignore_the_recorders_own_device_work(monkeypatch):
    memory = _Memory()
    monkeypatch.setattr(gpu_mode, "_ACTIVE", [memory])
    hook = gpu_mode._forward("on_device_synchronization")
    with recorder_work():
        assert in_recorder_work()
        hook()
    assert not in_recorder_work()
    assert memory.recording.device_syncs == 0
    hook()
    assert memory.recording.device_syncs == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("name", sorted(SHAPED_BY_VALUES))
def test_gpu_mode_orders_the_host_as_cpu_mode_does(name, fixed):
    program = _side_write_then_host_write(SHAPED_BY_VALUES[name])
    assert races(program, fixed, "gpu") == races(program, fixed)


def _device_to_pageable_then_other_stream_write(fixed: bool) -> None:
    """A D2H copy into pageable memory on ``side``, then ``other`` rewrites its source. The
    copy returns to the host only when done, so the host issues the rewrite after it: race
    free. Twin: the copy goes to pinned memory (truly asynchronous), and the rewrite races."""
    side = torch.cuda.Stream()
    other = torch.cuda.Stream()
    source = torch.ones(8, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    other.wait_stream(torch.cuda.current_stream())
    target = torch.zeros(8) if fixed else torch.zeros(8).pin_memory()
    with torch.cuda.stream(side):
        target.copy_(source, non_blocking=True)
    with torch.cuda.stream(other):
        source.fill_(2.0)


def test_a_non_blocking_copy_into_pageable_memory_orders_the_host():
    assert races(_device_to_pageable_then_other_stream_write, fixed=False) == [
        ("WAR", "source", "copy_@side", "fill_@other")]
    assert races(_device_to_pageable_then_other_stream_write, fixed=True) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fixed", [False, True])
def test_gpu_mode_orders_a_copy_into_pageable_memory_as_cpu_mode_does(fixed):
    program = _device_to_pageable_then_other_stream_write
    assert races(program, fixed, "gpu") == races(program, fixed)
