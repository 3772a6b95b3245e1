"""SGLang 0.5.23's own spec kernels beside the project's (issue 16 item 5).

Compared, imported from the installed wheel and never copied:

* ``sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras`` (one Triton
  launch, ``_gather_rows_kernel``) against ``model.kernels.gather.gather_spec_extras``
  (``unfused``, ``fused`` and, on CUDA, the project's own Triton launch);
* ``sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess`` (two Triton launches:
  split argmax, then finalize, writing each step's token into the chain's
  ``draft_tokens`` column as ``eagle_worker_v2.draft_forward`` calls it) against the
  project's topk=1 chain (``model.kernels.draft_chain.Topk1Chain``);
* SGLang's topk=1 chain rows (``_rebuild_topk1_chain_buffers`` in
  ``sglang.srt.speculative.base_spec_worker``: parents ``[-1, 0, .., S-2]`` and score
  indices ``[0, .., S-1]`` repeated for ``max_bs``) against ``Topk1Chain``'s rows, when
  that module imports.

Interfaces differ, so the inputs are adapted, never the code:

* SGLang's gather addresses each relay buffer as row-contiguous (``src * n + col``; its
  docstring: "Source buffers are allocated once ... guaranteed row-contiguous"), the
  project's takes strides. A strided case hands SGLang ``.contiguous()`` copies of the same
  values (the layout FutureMap gives it).
* SGLang's draft step takes logits and argmaxes them; the project's chain takes the step's
  tokens. Each step's token becomes logits whose unique maximum sits at that token
  (:func:`logits_for`), and SGLang's ``topk_p`` (constant 1.0) is compared with the chain's
  all-ones scores of a CUDA decode.

On the CPU, Triton runs only with ``TRITON_INTERPRET=1`` set before triton is imported;
tests/model/test_sglang_kernels.py runs its cases in a subprocess for that, so the variable
does not leak into other tests.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from overlap_harness.model.kernels.draft_chain import Topk1Chain
from overlap_harness.model.kernels.gather import available_impls, gather_spec_extras

VOCAB_FLOOR = 16  # logits are at least this wide, more when a token id needs it


def sglang_gather(indices: torch.Tensor, topk_p_buf: torch.Tensor,
                  topk_index_buf: torch.Tensor, output_tokens_buf: torch.Tensor,
                  hidden_states_buf: torch.Tensor | None) -> tuple[Any, ...]:
    """SGLang's Triton gather on row-contiguous copies of the buffers (its layout)."""
    from sglang.kernels.ops.speculative.gather_spec_extras import (  # deferred: optional
        gather_spec_extras as sglang_gather_spec_extras,
    )

    hidden = None if hidden_states_buf is None else hidden_states_buf.contiguous()
    return tuple(sglang_gather_spec_extras(indices, topk_p_buf.contiguous(),
                                           topk_index_buf.contiguous(),
                                           output_tokens_buf.contiguous(), hidden))


def gather_mismatches(indices: torch.Tensor, bufs: tuple[Any, ...]) -> list[str]:
    """Where SGLang's gather differs from each of the project's gathers available on the
    indices' device (values, shapes, dtypes, contiguity); empty when all agree."""
    theirs = sglang_gather(indices, *bufs)
    problems = []
    for impl in available_impls(indices.device):
        ours = tuple(gather_spec_extras(indices, *bufs, impl=impl))
        for field, got, want in zip(("topk_p", "topk_index", "bonus_tokens", "hidden_states"),
                                    theirs, ours, strict=True):
            problem = _differs(got, want)
            if problem:
                problems.append(f"{impl}.{field}: {problem}")
    return problems


def _differs(got: torch.Tensor | None, want: torch.Tensor | None) -> str | None:
    if got is None or want is None:
        return None if got is None and want is None else f"{got is None=} {want is None=}"
    if (got.shape, got.dtype) != (want.shape, want.dtype):
        return f"{tuple(got.shape)}/{got.dtype} vs {tuple(want.shape)}/{want.dtype}"
    if not (got.is_contiguous() and want.is_contiguous()):
        return "not contiguous"
    return None if torch.equal(got, want) else "values differ"


def logits_for(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """(b, vocab) float32 logits whose unique maximum per row is at ``tokens[row]``."""
    rows = tokens.shape[0]
    logits = torch.linspace(-1.0, 0.0, vocab, device=tokens.device).repeat(rows, 1)
    logits.scatter_(1, tokens.reshape(rows, 1).long(), 1.0)
    return logits


def sglang_chain(token_list: list[torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """SGLang's topk=1 draft chain for the step tokens ``token_list`` (each (b, 1)).

    As ``EAGLEWorkerV2.draft_forward`` (eagle_worker_v2.py 780-870): column 0 of
    ``draft_tokens`` is the draft-extend's top-1, then each later step's logits go through
    ``draft_topk1_postprocess``, which writes column ``i + 1`` and advances ``positions``."""
    from sglang.kernels.ops.speculative.topk1 import draft_topk1_postprocess  # deferred

    first = token_list[0]
    rows, steps = first.shape[0], len(token_list)
    draft_tokens = torch.empty((rows, steps), dtype=torch.int64, device=first.device)
    draft_tokens[:, :1].copy_(first)
    positions = torch.arange(rows, dtype=torch.int64, device=first.device) * 7
    start = positions.clone()
    topk_p, topk_index = [], []
    for step in range(steps - 1):
        logits = logits_for(token_list[step + 1], vocab)
        p, index = draft_topk1_postprocess(logits, positions, draft_tokens, step + 1)
        topk_p.append(p)
        topk_index.append(index)
    return {"draft_tokens": draft_tokens, "advanced": positions - start,
            "topk_p": torch.cat(topk_p, 1) if topk_p else first.new_empty((rows, 0)).float(),
            "topk_index": torch.cat(topk_index, 1) if topk_index else first.new_empty((rows, 0))}


def chain_mismatches(scores: list[torch.Tensor], tokens: list[torch.Tensor],
                     parents: list[torch.Tensor], max_bs: int) -> list[str]:
    """Where SGLang's topk=1 chain differs from the project's ``Topk1Chain`` fast path."""
    steps = len(tokens)
    rows = tokens[0].shape[0]
    ours = Topk1Chain(steps, steps + 1, max_bs=max_bs, device=tokens[0].device)
    fast = ours.draft(scores, tokens, parents)
    vocab = max(VOCAB_FLOOR, int(torch.cat(tokens, 1).max()) + 1)
    theirs = sglang_chain(tokens, vocab)
    problems = []
    if not torch.equal(theirs["draft_tokens"], fast.draft_tokens):
        problems.append("draft_tokens differ")
    if not torch.equal(theirs["advanced"], torch.full_like(theirs["advanced"], steps - 1)):
        problems.append("positions not advanced once per step")
    if not torch.equal(theirs["topk_index"], torch.cat(tokens[1:], 1) if steps > 1
                       else theirs["topk_index"]):
        problems.append("topk_index differs from the step tokens")
    if not bool((theirs["topk_p"] == 1.0).all()):
        problems.append("topk_p is not all ones")
    rows_theirs = sglang_chain_rows(steps, max_bs, tokens[0].device)
    if rows_theirs is not None:
        parents_theirs, indices_theirs = rows_theirs
        if not torch.equal(parents_theirs[:rows], fast.parent_list):
            problems.append("parent rows differ")
        if not torch.equal(indices_theirs[:rows], fast.top_scores_index):
            problems.append("score-index rows differ")
    return problems


def sglang_chain_rows(steps: int, max_bs: int, device: torch.device
                      ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """SGLang's preallocated topk=1 rows (``_rebuild_topk1_chain_buffers``) for S = ``steps``,
    or None when ``sglang.srt.speculative.base_spec_worker`` does not import here. Its
    ``max_bs`` comes from the runtime context, stubbed for the call with ``max_bs``."""
    try:
        import sglang.srt.speculative.base_spec_worker as base  # deferred: optional, heavy
    except ImportError:
        return None
    owner = next((cls for cls in vars(base).values() if isinstance(cls, type)
                  and "_rebuild_topk1_chain_buffers" in vars(cls)), None)
    if owner is None:
        return None
    worker = types.SimpleNamespace(topk=1, speculative_num_steps=steps,
                                   speculative_num_draft_tokens=steps + 1, server_args=None,
                                   device=device)
    context = types.SimpleNamespace(graph=types.SimpleNamespace(cuda_graph_config=None),
                                    max_running_requests=max_bs)
    saved = base.get_exec, base.get_schedule
    base.get_exec = base.get_schedule = lambda: context
    try:
        owner._rebuild_topk1_chain_buffers(worker)
    finally:
        base.get_exec, base.get_schedule = saved
    return worker._topk1_parents_prealloc, worker._topk1_score_indices_prealloc
