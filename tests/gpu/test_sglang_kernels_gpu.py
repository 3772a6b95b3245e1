"""SGLang 0.5.23's Triton spec kernels equal the project's on every kernel property case (CUDA).

Issue 16 item 5, GPU side (the CPU side, interpreted: tests/model/test_sglang_kernels.py).
Compared (overlap_harness/conformance/kernels.py says how the inputs are adapted):

* ``sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras`` with the
  project's ``unfused``, ``fused`` (Inductor) and ``triton`` gathers
  (``model.kernels.gather``);
* ``sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess``, driven as
  ``EAGLEWorkerV2.draft_forward`` drives it, with ``model.kernels.draft_chain.Topk1Chain``'s
  fast path (and SGLang's preallocated chain rows where base_spec_worker imports).

Every case of tests/model/test_kernels.py: its case builders, strategies and settings
(derandomized; 40 chain cases, 12 gather cases), real token ids (vocab up to 32000), on the
GPU. Needs a CUDA device and the sglang extra (``pip install -e '.[sglang]' && pip install
--no-deps sglang==0.5.23``); skipped with the reason otherwise.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from overlap_harness.conformance import kernels
from overlap_harness.conformance.sglang_env import unavailable_reason
from overlap_harness.model.kernels.gather import available_impls
from tests.model.test_kernels import CHAIN_CASE, GATHER_CASE, chain_inputs, gather_buffers

REASON = unavailable_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

CUDA = torch.device("cuda")
CHAIN = settings(derandomize=True, deadline=None, max_examples=40)  # test_kernels.FAST
GATHER = settings(derandomize=True, deadline=None, max_examples=12)  # test_kernels.SLOW


def on_cuda(values):
    """The case's tensors moved to the GPU (None stays None); views keep their strides."""
    return tuple(None if t is None else t.to(CUDA) for t in values)


@GATHER
@given(**GATHER_CASE)
def test_sglang_gather_equals_ours_on_cuda(pool, k, hidden, m, p_dtype, h_dtype, strided, seed):
    bufs = on_cuda(gather_buffers(pool, k, hidden, p_dtype, h_dtype, seed, strided))
    indices = torch.randint(0, pool, (m,), generator=torch.Generator().manual_seed(seed))
    assert "triton" in available_impls(CUDA)
    assert kernels.gather_mismatches(indices.to(CUDA), bufs) == []


@pytest.mark.parametrize("with_hidden", [True, False])
def test_sglang_gather_of_an_empty_batch_on_cuda(with_hidden):
    bufs = on_cuda(gather_buffers(5, 3, 7, "float32", "bfloat16" if with_hidden else None,
                                  seed=5))
    assert kernels.gather_mismatches(torch.empty(0, dtype=torch.long, device=CUDA), bufs) == []


@CHAIN
@given(**CHAIN_CASE)
def test_sglang_topk1_chain_equals_ours_on_cuda(b, num_steps, spare, ones, seed):
    """``ones`` as in the property test; SGLang's topk_p is 1.0 either way (greedy), and the
    project's fast path never reads the scores."""
    scores, tokens, parents = chain_inputs(b, num_steps, topk=1, seed=seed)
    if ones:
        scores = [torch.ones_like(s) for s in scores]
    scores, tokens, parents = (list(on_cuda(x)) for x in (scores, tokens, parents))
    assert kernels.chain_mismatches(scores, tokens, parents, max_bs=b + spare) == []
