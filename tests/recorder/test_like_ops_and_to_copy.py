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
