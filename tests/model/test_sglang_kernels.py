"""SGLang 0.5.23's Triton spec kernels equal the project's on the kernel property cases (CPU).

Issue 16 item 5, CPU side. Compared (overlap_harness/conformance/kernels.py says how the
inputs are adapted): SGLang's ``gather_spec_extras`` (sglang.kernels.ops.speculative) with
the project's ``unfused`` and ``fused`` gathers, and SGLang's ``draft_topk1_postprocess``
driven as ``draft_forward`` drives it with the project's ``Topk1Chain`` fast path. The cases
are those of tests/model/test_kernels.py: the same case builders (``gather_buffers``,
``chain_inputs``), the same strategies and settings.

Triton runs on the CPU only with ``TRITON_INTERPRET=1`` set before it is first imported, so
:func:`test_sglang_kernels_on_the_cpu_in_a_subprocess` runs the ``interpreted_*`` tests of
this file in a fresh pytest process with it set; in this process they skip. The interpreter
runs one Triton program at a time (about 7 ms each here), so the default run takes a fixed
sample of each property and small logits; ``-m slow`` runs every case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_harness.conformance import kernels
from overlap_harness.conformance.sglang_env import unavailable_reason
from tests.model.test_kernels import GATHER_CASE, chain_inputs, gather_buffers

REASON = unavailable_reason()
INNER = os.environ.get("OVERLAP_SGLANG_KERNELS_INNER") == "1"
ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("OVERLAP_SGLANG_KERNELS_FULL") == "1"
# The property tests' settings (test_kernels.py FAST and SLOW), or a fixed sample of them.
CHAIN = settings(derandomize=True, deadline=None, max_examples=40 if FULL else 6)
GATHER = settings(derandomize=True, deadline=None, max_examples=12 if FULL else 6)
INNER_TESTS = 6  # the interpreted_* tests below, all of which must run and pass
inner_only = pytest.mark.skipif(not INNER, reason="runs in the TRITON_INTERPRET=1 subprocess")


def _run_inner(full: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRITON_INTERPRET": "1", "OVERLAP_SGLANG_KERNELS_INNER": "1",
           "OVERLAP_SGLANG_KERNELS_FULL": "1" if full else "0"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "",
               "-k", "interpreted", str(Path(__file__).resolve())]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200, check=False)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.skipif(INNER, reason="the outer test only")
@pytest.mark.engine_run
def test_sglang_kernels_on_the_cpu_in_a_subprocess():
    result = _run_inner(full=False)
    tail = (result.stdout + result.stderr)[-3000:]
    assert result.returncode == 0, tail
    assert f"{INNER_TESTS} passed" in result.stdout and "skipped" not in result.stdout, tail


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.skipif(INNER, reason="the outer test only")
@pytest.mark.engine_run
def test_sglang_kernels_on_every_property_case():
    result = _run_inner(full=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


# --- run inside the subprocess -------------------------------------------------------------


@inner_only
@GATHER
@given(**GATHER_CASE)
def test_interpreted_gather_equals_ours(pool, k, hidden, m, p_dtype, h_dtype, strided, seed):
    bufs = gather_buffers(pool, k, hidden, p_dtype, h_dtype, seed, strided)
    indices = torch.randint(0, pool, (m,), generator=torch.Generator().manual_seed(seed))
    assert kernels.gather_mismatches(indices, bufs) == []


@inner_only
@pytest.mark.parametrize("with_hidden", [True, False])
def test_interpreted_gather_of_an_empty_batch(with_hidden):
    bufs = gather_buffers(5, 3, 7, "float32", "bfloat16" if with_hidden else None, seed=5)
    indices = torch.empty(0, dtype=torch.long)
    assert kernels.gather_mismatches(indices, bufs) == []
    assert kernels.sglang_gather(indices, *bufs)[2].shape == (0,)


@inner_only
def test_interpreted_gather_catches_a_wrong_row():
    """The comparison can fail: a buffer changed between the two gathers is reported."""
    bufs = gather_buffers(6, 2, 3, "float32", "float32", seed=1)
    indices = torch.tensor([4, 1])
    real = kernels.sglang_gather

    def shifted(idx, *buffers):
        return real((idx + 1) % 6, *buffers)

    kernels.sglang_gather = shifted
    try:
        problems = kernels.gather_mismatches(indices, bufs)
    finally:
        kernels.sglang_gather = real
    assert "unfused.topk_p: values differ" in problems


@inner_only
@CHAIN
@given(
    b=st.integers(1, 128),
    num_steps=st.integers(1, 8),
    spare=st.integers(0, 16),
    seed=st.integers(0, 2**16),
)
def test_interpreted_topk1_chain_equals_ours(b, num_steps, spare, seed):
    """The all-ones scores of a CUDA decode (``ones`` of the property test), which is what
    SGLang's postprocess returns as topk_p. Token ids keep their values in the full run; the
    sample folds them into 257 ids so each logits row is one Triton program."""
    scores, tokens, parents = chain_inputs(b, num_steps, topk=1, seed=seed)
    if not FULL:
        tokens = [t % 257 for t in tokens]
    scores = [torch.ones_like(s) for s in scores]
    assert kernels.chain_mismatches(scores, tokens, parents, max_bs=b + spare) == []


@inner_only
def test_interpreted_chain_comparison_can_fail():
    scores, tokens, parents = chain_inputs(3, 3, topk=1, seed=2)
    scores = [torch.ones_like(s) for s in scores]
    wrong = [tokens[0], tokens[1], (tokens[2] + 1) % 32000]
    # the project's chain is given the true tokens, SGLang's logits the changed last step
    real = kernels.sglang_chain
    kernels.sglang_chain = lambda token_list, vocab: real(wrong, max(vocab, 32001))
    try:
        assert "draft_tokens differ" in kernels.chain_mismatches(scores, tokens, parents, max_bs=3)
    finally:
        kernels.sglang_chain = real
