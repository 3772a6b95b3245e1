"""The kernel properties of tests/model/test_kernels.py, on CUDA, plus Triton == unfused.

Skipped where no CUDA device is present. On CUDA, ``fused`` compiles Triton code through
Inductor and ``triton`` is the hand-written single launch, so these are the runs that matter.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_harness.model.kernels.draft_chain import DraftPath, Topk1Chain, organize_draft_results
from overlap_harness.model.kernels.gather import (
    available_impls,
    fused_compile_count,
    gather_spec_extras,
    reset_fused_gather,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA = "cuda"
PROPS = settings(derandomize=True, deadline=None, max_examples=15)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.device.type == want.device.type == CUDA
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    assert got.is_contiguous() and want.is_contiguous()
    assert torch.equal(got, want)


def topk1_inputs(b: int, num_steps: int, seed: int, ones: bool):
    """PROTOCOL.md §5 topk=1 inputs on CUDA: (b,1,1) scores, (b,1) tokens, [-1,0] then [i]."""
    gen = torch.Generator().manual_seed(seed)
    scores, tokens, parents = [], [], []
    for i in range(num_steps):
        s = torch.ones(b, 1, 1) if ones else torch.rand(b, 1, 1, generator=gen)
        scores.append(s.to(CUDA))
        tokens.append(torch.randint(0, 32000, (b, 1), generator=gen).to(CUDA))
        p = torch.tensor([-1, 0]) if i == 0 else torch.tensor([i])
        parents.append(p.repeat(b, 1).to(CUDA))
    return scores, tokens, parents


@PROPS
@given(
    b=st.integers(1, 128),
    num_steps=st.integers(1, 8),
    ones=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_topk1_fast_path_equals_slow_path_on_cuda(b, num_steps, ones, seed):
    scores, tokens, parents = topk1_inputs(b, num_steps, seed, ones)
    chain = Topk1Chain(num_steps, num_steps + 1, max_bs=128, device=CUDA)
    fast = chain.draft(scores, tokens, parents)
    assert chain.last_path is DraftPath.FAST
    slow = organize_draft_results(scores, tokens, parents, num_steps + 1)
    for got, want in zip(fast, slow, strict=True):
        assert_same(got, want)


def test_batch_over_max_bs_takes_the_slow_path_on_cuda():
    scores, tokens, parents = topk1_inputs(9, 3, seed=1, ones=True)
    chain = Topk1Chain(3, 4, max_bs=8, device=CUDA)
    out = chain.draft(scores, tokens, parents)
    assert chain.last_path is DraftPath.SLOW
    for got, want in zip(out, organize_draft_results(scores, tokens, parents, 4), strict=True):
        assert_same(got, want)


def cuda_buffers(pool, k, hidden, p_dtype, h_dtype, seed, strided=False):
    gen = torch.Generator().manual_seed(seed)
    cols = 2 if strided else 1  # strided: every other column of a wider buffer
    topk_p = torch.rand(pool, k * cols, generator=gen).to(DTYPES[p_dtype])[:, ::cols]
    topk_index = torch.randint(0, 32000, (pool, k * cols), generator=gen)[:, ::cols]
    tokens = torch.randint(-1, 32000, (pool * cols,), generator=gen)[::cols]
    hid = None
    if h_dtype is not None:
        hid = torch.randn(pool, hidden * cols, generator=gen).to(DTYPES[h_dtype])[:, ::cols]
    return tuple(t.to(CUDA) if t is not None else None for t in (topk_p, topk_index, tokens, hid))


def check_against_unfused(indices, bufs, impl):
    ref = gather_spec_extras(indices, *bufs, impl="unfused")
    out = gather_spec_extras(indices, *bufs, impl=impl)
    for got, want, buf in zip(out, ref, bufs, strict=True):
        if buf is None:
            assert got is None and want is None
            continue
        assert_same(got, want)
        # and the reference itself equals a host-side row copy
        assert torch.equal(want.cpu(), buf.cpu()[indices.cpu()])


@PROPS
@given(
    pool=st.integers(1, 300),
    k=st.integers(1, 8),
    hidden=st.integers(1, 4096),
    m=st.integers(0, 300),
    p_dtype=st.sampled_from(["float32", "bfloat16"]),
    h_dtype=st.sampled_from([None, "float32", "bfloat16"]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fused_and_triton_gathers_equal_unfused_on_cuda(
    pool, k, hidden, m, p_dtype, h_dtype, strided, seed
):
    bufs = cuda_buffers(pool, k, hidden, p_dtype, h_dtype, seed, strided)
    gen = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, pool, (m,), generator=gen).to(CUDA)
    check_against_unfused(indices, bufs, "fused")
    check_against_unfused(indices, bufs, "triton")


@pytest.mark.parametrize("impl", ["unfused", "fused", "triton"])
def test_empty_batch_on_cuda(impl):
    bufs = cuda_buffers(5, 3, 7, "float32", "bfloat16", seed=2)
    out = gather_spec_extras(torch.empty(0, dtype=torch.long, device=CUDA), *bufs, impl=impl)
    assert [tuple(t.shape) for t in out] == [(0, 3), (0, 3), (0,), (0, 7)]
    assert [t.dtype for t in out] == [torch.float32, torch.int64, torch.int64, torch.bfloat16]


def test_fused_gather_compiles_once_while_m_varies_on_cuda():
    reset_fused_gather()
    bufs = cuda_buffers(300, 4, 1024, "float32", "bfloat16", seed=3)
    for m in [5, 1, 0, 2, 256, 1, 64, 0, 8]:
        indices = torch.randint(0, 300, (m,), device=CUDA)
        out = gather_spec_extras(indices, *bufs, impl="fused")
        assert torch.equal(out.hidden_states, bufs[3][indices])
    assert fused_compile_count() == 1


def test_all_three_impls_are_available_on_cuda():
    assert available_impls(CUDA) == ("unfused", "fused", "triton")
