"""The protocol's view of the shared kernels (model/kernels): the spec-extras gather and the
draft chain (topk=1 fast path, organize_draft_results otherwise), as the worker calls them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from overlap_harness.model.errors import HarnessError
from overlap_harness.model.kernels.draft_chain import Topk1Chain
from overlap_harness.model.kernels.draft_chain import organize_draft_results as _organize
from overlap_harness.model.kernels.gather import available_impls as _available_impls
from overlap_harness.model.kernels.gather import gather_spec_extras as _gather


def gather_impls(device: str) -> tuple[str, ...]:
    """The gather implementations that can run on ``device``."""
    return tuple(_available_impls(device))


def check_gather_impl(impl: str, device: str) -> None:
    """Raise :class:`HarnessError` up front when ``impl`` cannot run on ``device``.

    Checked before the run, not inside an op, so a scenario asking for ``triton`` on a CPU
    device fails with one clear line instead of an error deep in the simulator.
    """
    usable = gather_impls(device)
    if impl not in usable:
        raise HarnessError(
            f"protocol.gather = {impl!r} cannot run on device {device!r} "
            f"(available: {', '.join(usable)}); use 'unfused' or 'fused'"
        )


def gather_spec_extras(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_buf: torch.Tensor | None,
    impl: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Row-gather the four relay buffers by ``indices`` with implementation ``impl``."""
    out = _gather(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_buf, impl=impl)
    return out[0], out[1], out[2], out[3]


class DraftOrganizer:
    """``organize_draft_results`` plus the topk=1 fast path, as the draft worker holds them.

    The fast path (``Topk1Chain``) is used when topk=1 and N = S+1, as in SGLang #26424;
    otherwise the slow path. ``max_bs`` is the request pool size.
    """

    def __init__(self, topk: int, num_steps: int, num_draft_tokens: int, max_bs: int,
                 device: str = "cpu") -> None:
        self.n = num_draft_tokens
        self.chain: Any = None
        if topk == 1 and num_draft_tokens == num_steps + 1:
            self.chain = Topk1Chain(num_steps, num_draft_tokens, max(max_bs, 1), device)

    def draft_tokens(
        self,
        scores: Sequence[torch.Tensor],
        tokens: Sequence[torch.Tensor],
        parents: Sequence[torch.Tensor],
    ) -> torch.Tensor:
        """The (b, N-1) draft tokens of the tree the verify checks."""
        if tokens and tokens[0].shape[0] == 0:
            return torch.zeros((0, self.n - 1), dtype=torch.int64, device=tokens[0].device)
        if self.chain is not None:
            return self.chain.draft(scores, tokens, parents)[2]
        return _organize(scores, tokens, parents, self.n)[2]
