"""A declared kernel's CPU implementation reading device values on the host adds no host sync.

The real kernel reads its index values on the device, on its stream; the host never waits for
it. In CPU mode its stand-in (``cpu_impl``, or the function itself under ``declared``) may read
them with ``tolist()``, ``int()`` or ``numpy()``, or build a device tensor with
``torch.tensor(..., device="cuda")``. Were those recorded as the program's blocking reads, the
host would be ordered after the stream and a race of the program could vanish: here the
persistent pinned buffer refilled while its non-blocking upload is pending (the TokenSpeed
#689 pattern). Each racy program has its fixed twin (the host waits on an event recorded after
the upload before the refill), and the program's own blocking read outside a kernel still
orders the host (the sync is kept where the program makes it).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from overlap_harness.recorder import declared, reads, watch, writes


def _index_reads(how: str) -> Callable[[torch.Tensor], None]:
    """A host read of the device index tensor the way a stand-in kernel might make it."""
    forms: dict[str, Callable[[torch.Tensor], None]] = {
        "tolist": lambda idx: idx.tolist(),
        "int": lambda idx: [int(idx[i]) for i in range(idx.shape[0])],
        "item": lambda idx: idx[0].item(),
        "numpy": lambda idx: idx.numpy(),
        "repr": lambda idx: repr(idx),
        "tensor_on_device": lambda idx: torch.tensor([0, 1], device="cuda"),
        "to_cpu": lambda idx: idx.to("cpu").tolist(),
    }
    return forms[how]


def _gather_kernel(how: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    read = _index_reads(how)

    @declared(lambda out, table, idx: reads(table) + reads(idx) + writes(out))
    def gather(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        read(idx)  # the stand-in's own look at the index values
        return table[idx].clone()

    return gather


def _refill_program(how: str, host_waits_for_upload: bool, program_reads: bool = False) -> list:
    """Fill a persistent pinned buffer, upload it non-blocking, gather with it on the device,
    then refill the buffer for the next step. The races found."""
    gather = _gather_kernel(how)
    with watch("cpu") as watcher:
        pinned = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        pinned[0] = 1
        upload_done = torch.cuda.Event()
        idx = pinned.to("cuda", non_blocking=True)
        upload_done.record()
        table = torch.arange(8, device="cuda")
        gather(table, idx)
        if program_reads:  # the program's own blocking read: the host waits for the stream
            idx.tolist()
        if host_waits_for_upload:
            upload_done.synchronize()
        pinned[0] = 0  # the next step's refill of the same pinned memory
    return watcher.races


HOW = ["tolist", "int", "item", "numpy", "repr", "tensor_on_device", "to_cpu"]


@pytest.mark.parametrize("how", HOW)
def test_a_host_read_inside_the_kernel_does_not_hide_the_pending_upload_race(how):
    races = _refill_program(how, host_waits_for_upload=False)
    assert [(str(r.kind), r.buffer.split("@")[0]) for r in races] == [("host-D2H", "pinned")]


@pytest.mark.parametrize("how", HOW)
def test_the_fixed_twin_waiting_for_the_upload_is_race_free(how):
    assert _refill_program(how, host_waits_for_upload=True) == []


def test_the_programs_own_blocking_read_still_orders_the_host():
    """Outside the kernel ``tolist()`` of device memory is the program's blocking read: the
    host waits for the stream, upload included, so the refill is ordered after it."""
    assert _refill_program("tolist", host_waits_for_upload=False, program_reads=True) == []


@pytest.mark.parametrize(("side_waits", "races"), [(False, 1), (True, 0)])
def test_a_device_tensor_built_inside_the_kernel_is_still_watched(side_waits, races):
    """``torch.tensor(..., device="cuda")`` in the stand-in builds the kernel's output: no op
    of its own, but the tensor is device memory the declared write covers, and a second
    stream writing it unordered races that write."""

    @declared(lambda out, idx: reads(idx) + writes(out))
    def build(idx: torch.Tensor) -> torch.Tensor:
        return torch.tensor(idx.tolist(), device="cuda")

    with watch("cpu") as watcher:
        side = torch.cuda.Stream()
        out = build(torch.arange(3, device="cuda"))
        if side_waits:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.fill_(7)
        assert out.is_cuda
    assert [(str(r.kind), r.first.op_name, r.second.op_name) for r in watcher.races] == (
        [("WAW", "build", "fill_")] * races)
