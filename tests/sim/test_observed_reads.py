"""What an observing op read (``OpValues.run`` with ``observe=``): a list or array selection is
applied by numpy to the snapshot instead of through a torch index tensor. It must be what torch
indexing gives, element for element, in dtype and shape, and a copy (the snapshot is the op's
private input, which its function may change). The oracle is torch's own indexing with an
index tensor built here from plain ints; the twin of each fast case is a selection that takes
the torch path (a tuple, a bfloat16 buffer), which must agree too. Also end to end: an observed
read on SimDevice holds the values of the elements named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.sim.op_values import _observed
from overlap_harness.sim.sim_device import SimDevice

SNAP_INT = torch.arange(24, dtype=torch.int64).reshape(6, 4) * 7 - 30
SELECTIONS = [[0, 5, 5, 2], [-1, 0], [], [[1, 2], [3, 0]], np.array([4, 1], dtype=np.int64),
              np.array([2, 3], dtype=np.int32), [True, False, True]]


def _torch_oracle(snap: torch.Tensor, sel) -> torch.Tensor:
    """Torch indexing with an int64 index tensor made from the selection's plain ints (bools
    count as 0 and 1, as the device's index conversion makes them)."""
    ints = np.asarray(sel).astype(np.int64).tolist()
    return snap[torch.tensor(ints, dtype=torch.int64)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.bool])
@pytest.mark.parametrize("sel", SELECTIONS, ids=lambda s: repr(s)[:20])
def test_list_and_array_selections_equal_torch_indexing(sel, dtype) -> None:
    snap = SNAP_INT.to(dtype)
    got = _observed(snap, sel)
    want = _torch_oracle(snap, sel)
    assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert got.is_contiguous()
    if got.numel():
        before = got.clone()
        snap.fill_(0)  # the function may write its input: the observation is its own copy
        assert torch.equal(got, before)


@pytest.mark.parametrize("sel", [(1, [0, 2]), ([0, 1], slice(1, 3))],
                         ids=["int_list", "list_slice"])
def test_tuple_selection_takes_torch_and_agrees(sel) -> None:
    got = _observed(SNAP_INT, sel)
    rows = torch.tensor(np.atleast_1d(np.asarray(sel[0])).tolist())
    want = SNAP_INT[sel[0], torch.tensor(sel[1])] if isinstance(sel[0], int) \
        else SNAP_INT[rows, sel[1]]
    assert torch.equal(got, want)


def test_bfloat16_takes_torch_and_agrees() -> None:
    snap = SNAP_INT.to(torch.bfloat16)
    assert torch.equal(_observed(snap, [3, 0]), snap[torch.tensor([3, 0])])


def test_no_selection_is_the_snapshot() -> None:
    assert _observed(SNAP_INT, None) is SNAP_INT


def test_observed_read_on_the_device_holds_the_named_elements() -> None:
    dev = SimDevice()
    s = dev.stream("s")
    src = dev.buffer("src", (5,), torch.int64, fill=0)
    dev.host_write(src, None, torch.tensor([10, 11, 12, 13, 14]), name="init:src")
    out = dev.buffer("out", (3,), torch.int64, stream=s)
    dev.launch(s, "gather", lambda v: v[[4, 0, 4]] * 2, reads=[(src, [4, 0, 4])],
               writes=[out], observe="seen")
    dev.finish()
    ((key, (seen,)),) = dev.observations.items()
    assert key[0] == "seen"
    assert seen.tolist() == [14, 10, 14]
    assert dev.value(out).tolist() == [28, 20, 28]
