"""CPU mode details met in vLLM's code: ``zeros_like(t)`` reads only ``t``'s metadata (a host
write of pinned ``t`` does not race it), and ``.to("cpu", non_blocking=True, copy=True)``."""

from __future__ import annotations

import torch

from overlap_harness.recorder import watch


def _like_then_host_write(read_data: bool) -> list:
    with watch("cpu") as w:
        staging = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        shaped = torch.zeros_like(staging, device="cuda")  # metadata only
        if read_data:
            shaped.copy_(staging, non_blocking=True)  # a real read of the pinned data
        staging.numpy()[:] = 7  # the host rewrites it at once
    return [str(r.kind) for r in w.races]


def test_zeros_like_reads_no_data_but_a_copy_does():
    assert _like_then_host_write(read_data=False) == []
    assert _like_then_host_write(read_data=True) == ["host-D2H"]


def test_to_cpu_with_copy_true_is_a_non_blocking_d2h():
    def run(wait: bool) -> list:
        with watch("cpu") as w:
            x = torch.arange(4, device="cuda")
            host = x.to("cpu", non_blocking=True, copy=True)
            assert host.is_pinned() and not host.is_cuda
            if wait:
                torch.cuda.synchronize()
            host.tolist()
        return [str(r.kind) for r in w.races]

    assert run(wait=False) == ["host-D2H"]
    assert run(wait=True) == []


def _new_op_on_another_stream(new_op: str) -> list:
    """A device tensor written on the default stream, then, on a side stream with no wait,
    ``written.new_zeros(...)`` (or its kin): ``self`` gives only the new tensor's dtype and
    device; ``clone`` is the control, a real read."""
    with watch("cpu") as w:
        written = torch.zeros(8, device="cuda")
        written.add_(1)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            if new_op == "clone":
                written.clone()
            elif new_op == "new_full":
                written.new_full((3,), 2.0)
            else:
                getattr(written, new_op)((3,))
    return [str(r.kind) for r in w.races]


def test_new_zeros_and_its_kin_read_no_data_but_a_clone_does():
    for new_op in ("new_zeros", "new_ones", "new_empty", "new_full"):
        assert _new_op_on_another_stream(new_op) == [], new_op
    clone = _new_op_on_another_stream("clone")  # reads what both writes wrote
    assert clone and set(clone) == {"RAW"}
