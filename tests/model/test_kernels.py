"""The kernels equal their references on CPU (PROTOCOL.md §4, §5; SCENARIOS.md scenario 25).

* topk=1 fast path == organize_draft_results slow path: values, shapes, dtypes, contiguity.
* fused gather == unfused gather == a row-by-row copy, m = 0 included, with and without hidden
  states; the fused one compiles once while m varies (counted by its compiler backend).
* the CPU compiles the fused gather only when asked; otherwise, or without a C++ compiler, it
  runs eagerly with the same values after a one-line note.
* the error cases: N != S+1 at rebuild, bs > max_bs falls back, triton off CUDA refuses.
"""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlap_harness.model.errors import HarnessError
from overlap_harness.model.kernels.draft_chain import (
    DraftChainError,
    DraftPath,
    Topk1Chain,
    organize_draft_results,
)
from overlap_harness.model.kernels.gather import (
    GatherImplError,
    TritonUnavailableError,
    available_impls,
    eager_reason,
    fallback_impl,
    fused_compile_count,
    gather_spec_extras,
    reset_fused_gather,
    set_cpu_compile,
)

FAST = settings(derandomize=True, deadline=None, max_examples=40)


@pytest.fixture
def cpu_compile():
    """The fused gather is the subject here: compile it on the CPU (the simulator does not)."""
    set_cpu_compile(True)
    yield
    set_cpu_compile(None)


@pytest.fixture
def cpu_eager():
    """The default policy: no compile on the CPU unless asked."""
    set_cpu_compile(False)
    yield
    set_cpu_compile(None)
SLOW = settings(derandomize=True, deadline=None, max_examples=12)


# --- draft-chain inputs (PROTOCOL.md §5 "topk=1 inputs" and the general shapes) ---------------


def chain_inputs(b: int, num_steps: int, topk: int, seed: int):
    """Draft-step lists for b requests, S steps, topk k, with distinct scores (no topk ties)."""
    gen = torch.Generator().manual_seed(seed)
    k = topk
    widths = [k] + [k * k] * (num_steps - 1)
    # One permutation over all candidates of a row, scaled into (0, 1]: every score distinct,
    # so the top-k is unambiguous and any correct implementation picks the same set.
    perm = torch.stack([torch.randperm(sum(widths), generator=gen) for _ in range(b)])
    flat = (perm + 1).float() / sum(widths)
    scores, tokens, parents = [], [], []
    for i, part in enumerate(flat.split(widths, dim=1)):
        scores.append(part.reshape(b, 1 if i == 0 else k, k))
        tokens.append(torch.randint(0, 32000, (b, widths[i]), generator=gen))
        if i == 0:
            parents.append(torch.arange(-1, k).repeat(b, 1))
        else:
            chosen = torch.randint(0, k, (b, k), generator=gen)
            parents.append(chosen + k * k * (i - 1) + k)
    return scores, tokens, parents


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    assert got.is_contiguous() and want.is_contiguous()
    assert torch.equal(got, want)


#: One case of the topk=1 draft chain: batch, steps, spare rows of max_bs, all-ones scores or
#: not, the seed (shared by every test that compares chains on all of these).
CHAIN_CASE = dict(
    b=st.integers(1, 128),
    num_steps=st.integers(1, 8),
    spare=st.integers(0, 16),
    ones=st.booleans(),
    seed=st.integers(0, 2**16),
)


@FAST
@given(**CHAIN_CASE)
def test_topk1_fast_path_equals_slow_path(b, num_steps, spare, ones, seed):
    scores, tokens, parents = chain_inputs(b, num_steps, topk=1, seed=seed)
    if ones:  # after a CUDA decode the topk=1 scores are all ones (argmax replaces softmax)
        scores = [torch.ones_like(s) for s in scores]
    chain = Topk1Chain(num_steps, num_steps + 1, max_bs=b + spare)
    fast = chain.draft(scores, tokens, parents)
    assert chain.last_path is DraftPath.FAST
    slow = organize_draft_results(scores, tokens, parents, num_steps + 1)
    for got, want in zip(fast, slow, strict=True):
        assert_same(got, want)
    # The identity the fast path relies on, spelled out.
    parent_width = num_steps if num_steps > 1 else 0
    assert fast.parent_list.tolist() == [list(range(-1, parent_width - 1))] * b
    assert fast.top_scores_index.tolist() == [list(range(num_steps))] * b
    assert fast.draft_tokens.tolist() == torch.cat(tokens, dim=1).tolist()


@FAST
@given(
    b=st.integers(1, 16),
    num_steps=st.integers(1, 5),
    topk=st.integers(2, 4),
    extra=st.integers(0, 30),
    seed=st.integers(0, 2**16),
)
def test_slow_path_matches_a_row_by_row_reference(b, num_steps, topk, extra, seed):
    scores, tokens, parents = chain_inputs(b, num_steps, topk, seed)
    candidates = topk + (num_steps - 1) * topk * topk
    n = 1 + min(candidates, 1 + extra)
    out = organize_draft_results(scores, tokens, parents, n)
    flat_scores = torch.cat(scores, dim=1).flatten(1).tolist()
    flat_tokens = torch.cat(tokens, dim=1).tolist()
    for row in range(b):
        best = sorted(range(candidates), key=lambda j: -flat_scores[row][j])[: n - 1]
        assert out.top_scores_index[row].tolist() == sorted(best)
        assert out.draft_tokens[row].tolist() == [flat_tokens[row][j] for j in sorted(best)]
    want_parent_width = 0 if num_steps == 1 else (topk + 1) + (num_steps - 2) * topk
    assert out.parent_list.shape == (b, want_parent_width)
    assert out.parent_list.dtype == torch.long
    assert out.top_scores_index.dtype == torch.long


def test_single_step_parent_list_is_empty_long():
    scores, tokens, parents = chain_inputs(3, 1, topk=2, seed=1)
    out = organize_draft_results(scores, tokens, parents, 2)
    assert out.parent_list.shape == (3, 0)
    assert out.parent_list.dtype == torch.long


@pytest.mark.parametrize(("num_steps", "num_draft_tokens"), [(3, 3), (3, 5), (1, 1), (4, 8)])
def test_rebuild_rejects_n_other_than_s_plus_1(num_steps, num_draft_tokens):
    with pytest.raises(DraftChainError, match=f"set num_draft_tokens={num_steps + 1}"):
        Topk1Chain(num_steps, num_draft_tokens, max_bs=8)
    chain = Topk1Chain(2, 3, max_bs=8)
    with pytest.raises(DraftChainError, match="must equal num_steps"):
        chain.rebuild(num_steps, num_draft_tokens, max_bs=8)
    assert issubclass(DraftChainError, HarnessError)


def test_batch_over_max_bs_takes_the_slow_path():
    scores, tokens, parents = chain_inputs(9, 3, topk=1, seed=2)
    chain = Topk1Chain(3, 4, max_bs=8)
    out = chain.draft(scores, tokens, parents)
    assert chain.last_path is DraftPath.SLOW
    for got, want in zip(out, organize_draft_results(scores, tokens, parents, 4), strict=True):
        assert_same(got, want)
    chain.draft([s[:8] for s in scores], [t[:8] for t in tokens], [p[:8] for p in parents])
    assert chain.last_path is DraftPath.FAST


def test_topk_above_one_takes_the_slow_path():
    scores, tokens, parents = chain_inputs(4, 2, topk=2, seed=3)
    chain = Topk1Chain(2, 3, max_bs=8)
    out = chain.draft(scores, tokens, parents)
    assert chain.last_path is DraftPath.SLOW
    assert torch.equal(out.top_scores_index, organize_draft_results(scores, tokens, parents, 3)[1])


def test_rebuild_reallocates_only_when_steps_change():
    chain = Topk1Chain(2, 3, max_bs=4)
    chain.rebuild(2, 3, max_bs=4)
    assert chain.rebuilds == 1
    chain.rebuild(5, 6, max_bs=4)
    assert chain.rebuilds == 2
    assert chain.parents.shape == (4, 5) and chain.indices.shape == (4, 5)
    # Built with repeat, so every row is its own memory (a raw-pointer reader sees real rows).
    assert chain.parents.stride() == (5, 1) and chain.indices.stride() == (5, 1)
    scores, tokens, parents = chain_inputs(2, 3, topk=1, seed=4)
    with pytest.raises(DraftChainError, match="call rebuild"):
        chain.draft(scores, tokens, parents)


# --- gather --------------------------------------------------------------------------------------

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def gather_buffers(
    pool: int, k: int, hidden: int, p_dtype: str, h_dtype: str | None, seed: int, strided=False
):
    """Relay buffers of P rows; ``strided`` takes every other column of wider buffers."""
    gen = torch.Generator().manual_seed(seed)
    c = 2 if strided else 1
    topk_p = torch.rand(pool, k * c, generator=gen).to(DTYPES[p_dtype])[:, ::c]
    topk_index = torch.randint(0, 32000, (pool, k * c), generator=gen)[:, ::c]
    tokens = torch.randint(-1, 32000, (pool * c,), generator=gen)[::c]
    hid = None
    if h_dtype is not None:
        hid = torch.randn(pool, hidden * c, generator=gen).to(DTYPES[h_dtype])[:, ::c]
    return topk_p, topk_index, tokens, hid


#: One case of the spec-extras gather: pool rows, top-k, hidden width, gathered rows, dtypes,
#: a strided view or not, the seed (shared by every test that compares gathers).
GATHER_CASE = dict(
    pool=st.integers(1, 64),
    k=st.integers(1, 8),
    hidden=st.integers(1, 96),
    m=st.integers(0, 80),
    p_dtype=st.sampled_from(["float32", "bfloat16"]),
    h_dtype=st.sampled_from([None, "float32", "bfloat16"]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)


def row_by_row(indices: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """An independent reference: copy row by row in Python."""
    rows = [buf[int(j)] for j in indices]
    return torch.stack(rows) if rows else buf.new_empty((0, *buf.shape[1:]))


@settings(SLOW, suppress_health_check=[HealthCheck.function_scoped_fixture])  # set once
@given(**GATHER_CASE)
def test_fused_gather_equals_unfused(
    pool, k, hidden, m, p_dtype, h_dtype, strided, seed, cpu_compile
):
    bufs = gather_buffers(pool, k, hidden, p_dtype, h_dtype, seed, strided)
    indices = torch.randint(0, pool, (m,), generator=torch.Generator().manual_seed(seed))
    ref = gather_spec_extras(indices, *bufs, impl="unfused")
    fused = gather_spec_extras(indices, *bufs, impl="fused")
    assert (fused.hidden_states is None) == (h_dtype is None)
    for got, want, buf in zip(fused, ref, bufs, strict=True):
        if buf is None:
            assert got is None and want is None
            continue
        assert_same(got, want)
        assert torch.equal(want, row_by_row(indices, buf))


@pytest.mark.parametrize("impl", ["unfused", "fused"])
@pytest.mark.parametrize("with_hidden", [True, False])
def test_empty_batch_gives_empty_outputs_of_the_right_kind(impl, with_hidden, cpu_compile):
    bufs = gather_buffers(5, 3, 7, "float32", "bfloat16" if with_hidden else None, seed=5)
    out = gather_spec_extras(torch.empty(0, dtype=torch.long), *bufs, impl=impl)
    assert (out.topk_p.shape, out.topk_p.dtype) == ((0, 3), torch.float32)
    assert (out.topk_index.shape, out.topk_index.dtype) == ((0, 3), torch.int64)
    assert (out.bonus_tokens.shape, out.bonus_tokens.dtype) == ((0,), torch.int64)
    if with_hidden:
        assert (out.hidden_states.shape, out.hidden_states.dtype) == ((0, 7), torch.bfloat16)
    else:
        assert out.hidden_states is None


def test_fused_gather_compiles_once_while_m_varies(cpu_compile):
    reset_fused_gather()
    assert fused_compile_count() == 0
    bufs = gather_buffers(40, 4, 16, "float32", "float32", seed=6)
    for m in [5, 1, 0, 2, 39, 1, 64, 0, 7]:
        indices = torch.randint(0, 40, (m,))
        out = gather_spec_extras(indices, *bufs, impl="fused")
        assert torch.equal(out.hidden_states, bufs[3][indices])
    assert fused_compile_count() == 1
    # Other buffer sizes (k = 1, H = 1 included) reuse the same graph too.
    for pool, k, hidden in [(3, 1, 1), (100, 8, 33)]:
        bufs = gather_buffers(pool, k, hidden, "float32", "float32", seed=7)
        gather_spec_extras(torch.tensor([0, pool - 1]), *bufs, impl="fused")
    assert fused_compile_count() == 1
    # The counter is live: a new dtype set is a new graph, and it is counted.
    bufs = gather_buffers(40, 4, 16, "float32", None, seed=8)
    gather_spec_extras(torch.tensor([1, 2]), *bufs, impl="fused")
    assert fused_compile_count() == 2


def test_fused_gather_leaves_callers_tensors_unmarked(cpu_compile):
    bufs = gather_buffers(8, 2, 4, "float32", "float32", seed=9)
    indices = torch.tensor([1, 7])
    gather_spec_extras(indices, *bufs, impl="fused")
    for t in (indices, *bufs):
        assert not hasattr(t, "_dynamo_unbacked_indices")


def test_triton_gather_on_cpu_raises_a_clear_error():
    bufs = gather_buffers(8, 2, 4, "float32", None, seed=10)
    with pytest.raises(TritonUnavailableError, match="runs on CUDA only, got indices on cpu"):
        gather_spec_extras(torch.tensor([1, 2]), *bufs, impl="triton")
    assert issubclass(TritonUnavailableError, HarnessError)


def test_unknown_impl_names_the_choices():
    bufs = gather_buffers(8, 2, 4, "float32", None, seed=11)
    want = r"expected one of unfused\|fused\|triton, got 'fast'"
    with pytest.raises(GatherImplError, match=want):
        gather_spec_extras(torch.tensor([1]), *bufs, impl="fast")


def test_available_impls_and_fallback_on_cpu():
    assert available_impls("cpu") == ("unfused", "fused")
    assert available_impls(torch.device("cpu")) == ("unfused", "fused")
    assert fallback_impl("triton", "cpu") == "fused"
    assert fallback_impl("unfused", "cpu") == "unfused"
    with pytest.raises(GatherImplError):
        fallback_impl("nope", "cpu")


def test_fused_gather_on_cpu_runs_eagerly_by_default_with_one_note(cpu_eager, caplog):
    reset_fused_gather()
    bufs = gather_buffers(12, 3, 5, "float32", "float32", seed=12)
    with caplog.at_level(logging.WARNING, logger="overlap_harness.kernels"):
        for m in (4, 0, 9):
            indices = torch.randint(0, 12, (m,), generator=torch.Generator().manual_seed(m))
            out = gather_spec_extras(indices, *bufs, impl="fused")
            for got, want in zip(out, gather_spec_extras(indices, *bufs, impl="unfused"),
                                 strict=True):
                assert_same(got, want)
    assert fused_compile_count() == 0  # torch.compile never ran
    notes = [r.getMessage() for r in caplog.records]
    assert notes == ["overlap-harness: note: the fused gather runs uncompiled on the CPU, "
                     "same values (compiled only on a GPU or with "
                     "OVERLAP_HARNESS_COMPILE_GATHER=1)"]


def test_fused_gather_asked_to_compile_without_a_compiler_falls_back(monkeypatch, caplog):
    # Inductor searches config.cpp.cxx; a name that is no compiler is a machine without g++.
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (None, "no-such-cxx-compiler"))
    monkeypatch.setenv("OVERLAP_HARNESS_COMPILE_GATHER", "1")
    monkeypatch.setenv("CXX", "no-such-cxx-compiler")
    set_cpu_compile(None)
    reset_fused_gather()
    bufs = gather_buffers(9, 2, 3, "float32", None, seed=13)
    indices = torch.tensor([8, 0, 3])
    with caplog.at_level(logging.WARNING, logger="overlap_harness.kernels"):
        out = gather_spec_extras(indices, *bufs, impl="fused")
    assert torch.equal(out.bonus_tokens, bufs[2][indices])
    assert fused_compile_count() == 0
    assert eager_reason() is not None and eager_reason().startswith("no C++ compiler")
    assert len(caplog.records) == 1 and "no C++ compiler" in caplog.records[0].getMessage()
    set_cpu_compile(None)
    reset_fused_gather()
