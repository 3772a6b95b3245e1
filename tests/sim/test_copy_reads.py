"""A copy from ``src[sel]`` reads only the selected elements from the source's memory at its
start (sim/op_values.py, ``SelectionCopy``) instead of snapshotting the whole source. The
oracle is torch's own indexing of the source's value (no simulator code); each case is checked
with a write to the source that lands while the copy runs (the copy must still hold the
source as of its start), and the selections that keep the snapshot path are among the cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.sim.sim_device import SimDevice

START = torch.arange(12, dtype=torch.int64).reshape(6, 2) * 10

CASES = [
    np.array([4, 0, 4]),  # an index array, repeats allowed on a read
    [5, -1, 2],  # a list: an int64 index array, negative ids from the end
    np.array([True, False, True, False, False, True]),  # a mask, taken as ids 1 and 0
    slice(1, 5),
    slice(0, 6, 2),
    slice(4, None),
    3,  # an int: the snapshot path
    (slice(0, 2), 1),  # a tuple: the snapshot path
    torch.tensor([2, 1]),  # a tensor: the snapshot path
]


def copied(sel) -> torch.Tensor:
    """What a D2H copy of ``src[sel]`` (10 us) lands in a pinned buffer, while another stream
    overwrites all of ``src`` with -1 in the middle of the copy."""
    dev = SimDevice(host_launch_us=1.0)
    s, f = dev.stream("s"), dev.stream("f")
    src = dev.buffer("src", (6, 2), torch.int64, fill=0)
    dev.host_write(src, None, START, name="init:src")
    want = START[torch.as_tensor(np.asarray(sel, dtype=np.int64))] \
        if isinstance(sel, list | np.ndarray) else START[sel]
    dst = dev.buffer("dst", tuple(want.shape), torch.int64, pinned=True, fill=0)
    dev.copy(s, (src, sel), dst, non_blocking=True, cost_us=10)
    dev.launch(f, "clobber", lambda: torch.full((6, 2), -1), writes=[src], cost_us=2)
    dev.finish()
    assert dev.value(src).eq(-1).all()  # the clobber landed before the copy's end
    return dev.value(dst), want


@pytest.mark.parametrize("sel", CASES, ids=repr)
def test_a_copy_lands_what_torch_indexing_of_the_source_at_its_start_gives(sel) -> None:
    got, want = copied(sel)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
