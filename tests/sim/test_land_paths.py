"""Writes land through the buffer's numpy view when the value is a tensor of the buffer's own
dtype (sim/op_values.py, ``OpValues.land``) and through torch otherwise. The oracle here is
torch's own assignment on a copy of the memory (no simulator code), and each case has the twin
that must stay on the torch path: a value that needs a conversion, a tuple selection, an index
set that repeats an element, a dtype numpy lacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from overlap_harness.sim.op_values import numpy_view
from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64


def landed(shape: tuple[int, ...], dtype: torch.dtype, sel, value) -> torch.Tensor:
    """What a buffer of ``shape`` (filled with 0..n-1) holds after one op writes ``value``
    (its function's result) to ``buf[sel]``."""
    dev = SimDevice()
    s = dev.stream("s")
    buf = dev.buffer("b", shape, dtype, stream=s)
    start = torch.arange(int(np.prod(shape))).to(dtype).reshape(shape)
    dev.launch(s, "init", lambda: start, writes=[buf])
    dev.launch(s, "k", lambda: value, writes=[(buf, sel)])
    dev.finish()
    return dev.value(buf)


def torch_oracle(shape: tuple[int, ...], dtype: torch.dtype, sel, value) -> torch.Tensor:
    out = torch.arange(int(np.prod(shape))).to(dtype).reshape(shape)
    index = torch.as_tensor(sel) if isinstance(sel, np.ndarray) else sel  # a list: torch's own
    if sel is None:
        out.copy_(torch.as_tensor(value, dtype=dtype).expand(shape))
    else:
        out[index] = torch.as_tensor(value, dtype=dtype)
    return out


CASES = [
    # (shape, dtype, selection, value): the numpy path
    ((8,), I64, np.array([6, 1, 3]), torch.tensor([-1, -2, -3])),
    ((8,), I64, np.array([-1, 0]), torch.tensor([9, 8])),  # negative indices wrap
    ((8,), I64, slice(2, 7, 2), torch.tensor([5, 6, 7])),
    ((8,), I64, None, torch.tensor(4)),  # broadcast over the whole buffer
    ((3, 4), torch.float32, np.array([2, 0]), torch.full((2, 4), 0.5)),  # rows
    ((3, 4), torch.float32, None, torch.tensor([1.5, 2.5, 3.5, 4.5])),  # row broadcast
    ((6,), torch.bool, np.array([1, 4]), torch.tensor([True, False])),
    ((4,), I64, np.array([True, False, True, False]), torch.tensor([7, 7])),  # mask
    ((8,), I64, [5, 0, -2], torch.tensor([1, 2, 3])),  # a list: an int64 index array
    ((3, 4), torch.float32, [2], torch.full((1, 4), 0.25)),  # a list of rows
    # the torch path: conversions, tuple selections, repeats, a dtype numpy lacks
    ((8,), I64, np.array([1, 2]), torch.tensor([1.9, -2.7])),  # float into int64
    ((8,), I64, np.array([1, 2]), [3, 4]),  # a list, converted
    ((3, 4), I64, (1, slice(0, 2)), torch.tensor([9, 9])),
    ((8,), I64, np.array([2, 2, 5]), torch.tensor([1, 2, 3])),  # repeats element 2
    ((8,), torch.bfloat16, np.array([0, 7]), torch.tensor([0.5, 1.5], dtype=torch.bfloat16)),
]


@pytest.mark.parametrize(("shape", "dtype", "sel", "value"), CASES)
def test_landed_values_match_torch_assignment(shape, dtype, sel, value) -> None:
    got = landed(shape, dtype, sel, value)
    want = torch_oracle(shape, dtype, sel, value)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_numpy_view_shares_memory_and_is_none_without_a_numpy_dtype() -> None:
    t = torch.zeros(4, dtype=I64)
    view = numpy_view(t)
    assert view is not None
    view[1] = 5
    assert t.tolist() == [0, 5, 0, 0]
    assert numpy_view(torch.zeros(4, dtype=torch.bfloat16)) is None


@pytest.mark.parametrize("dtype", [I64, torch.float32, torch.bool, torch.bfloat16])
def test_a_read_snapshot_is_a_private_copy_of_the_whole_buffer(dtype) -> None:
    """What the op's function receives: the buffer's value at the op's start, as a tensor of
    its dtype and shape that the function may change without touching the buffer (numpy
    copies for numpy dtypes, ``clone`` for bfloat16)."""
    dev = SimDevice()
    s = dev.stream("s")
    buf = dev.buffer("b", (2, 3), dtype, stream=s)
    start = torch.arange(6).to(dtype).reshape(2, 3)
    dev.launch(s, "init", lambda: start, writes=[buf])
    seen = []

    def fn(value: torch.Tensor) -> torch.Tensor:
        seen.append((value.dtype, value.shape, value.is_contiguous(), value.clone()))
        value.zero_()  # the function's own copy
        return value[0, :1]

    dev.launch(s, "k", fn, reads=[buf], writes=[(buf, (1, slice(2, 3)))])
    dev.finish()
    assert seen[0][:3] == (dtype, torch.Size([2, 3]), True)
    assert torch.equal(seen[0][3], start)
    want = start.clone()
    want[1, 2] = 0  # only the declared write landed
    assert torch.equal(dev.value(buf), want)
