"""Turning S draft steps into the draft tree's inputs, and the topk=1 shortcut (PROTOCOL.md §5).

:func:`organize_draft_results` is the general ("slow") path for any topk k: it picks the N-1
best-scoring candidates over all steps with a top-k, sorts their positions, gathers their
tokens, and concatenates the steps' parent pointers. For topk = 1 that procedure is an identity
(every candidate is kept, in order), so :class:`Topk1Chain` skips the top-k, sort and gather
kernels: it returns preallocated parent and index rows plus the concatenated tokens
(SGLang #26424). Both paths must give equal values, shapes, dtypes and contiguity.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

import torch

from overlap_harness.model.errors import HarnessError

__all__ = [
    "DraftChainError",
    "DraftPath",
    "DraftResults",
    "Topk1Chain",
    "organize_draft_results",
]


class DraftChainError(HarnessError):
    """The draft chain was built or called with inconsistent sizes."""


class DraftPath(StrEnum):
    """Which path :meth:`Topk1Chain.draft` took."""

    FAST = "fast"
    SLOW = "slow"


class DraftResults(NamedTuple):
    """The draft tree's inputs for b requests."""

    parent_list: torch.Tensor  # (b, (k+1) + (S-2)k) int64; (b, 0) when S = 1
    top_scores_index: torch.Tensor  # (b, N-1) int64, ascending
    draft_tokens: torch.Tensor  # (b, N-1), the tokens' dtype


def _check_steps(
    score_list: Sequence[torch.Tensor],
    token_list: Sequence[torch.Tensor],
    parents_list: Sequence[torch.Tensor],
) -> None:
    if not score_list or len(score_list) != len(token_list) or len(token_list) != len(parents_list):
        raise DraftChainError(
            "score_list, token_list and parents_list need one entry per step and at least one "
            f"step, got {len(score_list)}, {len(token_list)}, {len(parents_list)}"
        )


def organize_draft_results(
    score_list: Sequence[torch.Tensor],
    token_list: Sequence[torch.Tensor],
    parents_list: Sequence[torch.Tensor],
    num_draft_tokens: int,
) -> DraftResults:
    """The slow path: pick the N-1 best candidates of S draft steps, for any topk k.

    Args:
        score_list: per step, (b, 1, k) at step 0 and cumulative (b, k, k) after.
        token_list: per step, (b, k) at step 0 and (b, k*k) after.
        parents_list: per step, (b, k+1) at step 0 and (b, k) after, int64.
        num_draft_tokens: N, the tree size including the bonus token; N-1 candidates are kept.

    Returns:
        :class:`DraftResults`: the parents of every step but the last (an empty int64 (b, 0)
        when S = 1), the kept positions sorted ascending, and the tokens at those positions.

    Raises:
        DraftChainError: the lists differ in length or are empty, or N-1 exceeds the number of
            candidates.
    """
    _check_steps(score_list, token_list, parents_list)
    scores = torch.cat(list(score_list), dim=1).flatten(1)  # (b, k + (S-1)k^2)
    tokens = torch.cat([t.flatten(1) for t in token_list], dim=1)
    keep = num_draft_tokens - 1
    if not 0 <= keep <= scores.shape[1]:
        raise DraftChainError(
            f"num_draft_tokens={num_draft_tokens}: need 1 <= N <= {scores.shape[1] + 1} "
            f"(the {scores.shape[1]} candidates plus the bonus token)"
        )
    top_scores_index = torch.topk(scores, keep, dim=-1).indices
    top_scores_index = torch.sort(top_scores_index, dim=-1).values
    draft_tokens = torch.gather(tokens, 1, top_scores_index)
    if len(parents_list) > 1:
        parent_list = torch.cat(list(parents_list[:-1]), dim=1)
    else:
        # Long, not float: the tree builder reads it as int64 through a raw pointer.
        parent_list = torch.empty((scores.shape[0], 0), dtype=torch.long, device=scores.device)
    return DraftResults(parent_list, top_scores_index, draft_tokens)


class Topk1Chain:
    """Preallocated rows that replace :func:`organize_draft_results` when topk = 1.

    With topk = 1 and N = S + 1 the slow path always yields parents [-1, 0, .., S-2] (empty when
    S = 1), indices [0, .., S-1] and the step tokens side by side. Those rows are built once for
    ``max_bs`` requests; :meth:`draft` hands out their first ``bs`` rows. The rows are contiguous
    copies (``repeat``, not ``expand``) because the consumer reads raw pointers. Callers must
    not write into the returned parent and index tensors: they are views of shared buffers.

    Attributes:
        last_path: the path the latest :meth:`draft` took (None before the first call).
        rebuilds: how many times the buffers were (re)allocated.
    """

    def __init__(
        self,
        num_steps: int,
        num_draft_tokens: int,
        max_bs: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.num_steps = 0
        self.num_draft_tokens = 0
        self.max_bs = 0
        self.parents = torch.empty((0, 0), dtype=torch.long, device=self.device)
        self.indices = torch.empty((0, 0), dtype=torch.long, device=self.device)
        self.last_path: DraftPath | None = None
        self.rebuilds = 0
        self.rebuild(num_steps, num_draft_tokens, max_bs)

    def rebuild(self, num_steps: int, num_draft_tokens: int, max_bs: int) -> None:
        """(Re)allocate the rows for S = ``num_steps``; call it whenever S or N changes.

        Raises:
            DraftChainError: N != S + 1 (the identity behind the fast path needs it), S < 1,
                or ``max_bs`` < 1.
        """
        if num_steps < 1:
            raise DraftChainError(f"topk=1 chain: num_steps must be >= 1, got {num_steps}")
        if num_draft_tokens != num_steps + 1:
            raise DraftChainError(
                f"topk=1 chain: num_draft_tokens must equal num_steps + 1, got "
                f"num_draft_tokens={num_draft_tokens}, num_steps={num_steps}; with topk=1 "
                f"set num_draft_tokens={num_steps + 1}"
            )
        if max_bs < 1:
            raise DraftChainError(f"topk=1 chain: max_bs must be >= 1, got {max_bs}")
        if (num_steps, num_draft_tokens, max_bs) == (
            self.num_steps,
            self.num_draft_tokens,
            self.max_bs,
        ):
            return
        width = num_steps if num_steps > 1 else 0
        long = {"dtype": torch.long, "device": self.device}
        self.parents = torch.arange(-1, width - 1, **long).repeat(max_bs, 1)
        self.indices = torch.arange(num_steps, **long).repeat(max_bs, 1)
        self.num_steps, self.num_draft_tokens, self.max_bs = num_steps, num_draft_tokens, max_bs
        self.rebuilds += 1

    def draft(
        self,
        score_list: Sequence[torch.Tensor],
        token_list: Sequence[torch.Tensor],
        parents_list: Sequence[torch.Tensor],
    ) -> DraftResults:
        """Organize S steps: the fast path when topk = 1 and bs <= max_bs, else the slow path.

        The path taken is left in :attr:`last_path`.

        Raises:
            DraftChainError: the step lists disagree, or hold a different S than the chain was
                built for (rebuild first: stale rows would give a wrong-width tree).
        """
        _check_steps(score_list, token_list, parents_list)
        if len(token_list) != self.num_steps:
            raise DraftChainError(
                f"topk=1 chain built for num_steps={self.num_steps} got {len(token_list)} "
                "steps; call rebuild() after changing num_steps"
            )
        bs, topk = token_list[0].shape[0], token_list[0].shape[1]
        if topk == 1 and bs <= self.max_bs:
            self.last_path = DraftPath.FAST
            tokens = torch.cat(list(token_list), dim=1)
            return DraftResults(self.parents[:bs], self.indices[:bs], tokens)
        self.last_path = DraftPath.SLOW
        return organize_draft_results(score_list, token_list, parents_list, self.num_draft_tokens)
