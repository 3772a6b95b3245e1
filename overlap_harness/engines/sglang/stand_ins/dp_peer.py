"""The scripted peer rank of attention data parallelism (the feature:
:mod:`..features.dp_attention`): its steps (:class:`PeerStep`), the sync row it contributes
(laid out by SGLang's own ``MLPSyncBatchInfo``), and the two-rank CPU process group whose
all-gather answers with it (:class:`ScriptedPeerGroup`); and the fake worker of this rank
(:mod:`.dp_rank_worker`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from overlap_harness.engines.core.strict import UnplannedUseError

#: the DP width driven: this rank and one scripted peer
DP_RANKS = 2


@dataclass(frozen=True, slots=True)
class PeerStep:
    """What the peer rank runs in one iteration: ``mode`` is ``"idle"`` (nothing),
    ``"decode"`` (``tokens`` running requests) or ``"extend"`` (a prefill of ``tokens``
    tokens, one request)."""

    mode: str
    tokens: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("idle", "decode", "extend"):
            raise ValueError(f"peer step mode {self.mode!r}: idle, decode or extend")
        if (self.mode == "idle") != (self.tokens == 0):
            raise ValueError(f"peer step {self.mode} with {self.tokens} tokens")


IDLE = PeerStep("idle")


def peer_row(step: PeerStep) -> torch.Tensor:
    """The sync row the peer's scheduler contributes for ``step``, laid out by SGLang's
    ``MLPSyncBatchInfo``. Its votes are those of ``dp_attn.py`` for such a batch with CUDA
    graphs on, coordinated prefill graphs off and two-batch overlap off: the decode graph
    for a decode or idle batch, not for a prefill; the prefill graph only when idle; the
    draft graph always (no speculative input); no TBO; one logprob token per request."""
    from sglang.srt.managers.scheduler_components.dp_attn import MLPSyncBatchInfo
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = {"idle": ForwardMode.IDLE, "decode": ForwardMode.DECODE,
            "extend": ForwardMode.EXTEND}[step.mode]
    requests = step.tokens if step.mode == "decode" else int(step.mode == "extend")
    fields = {"num_dp_ranks": DP_RANKS, "dp_size": DP_RANKS, "tp_size": 1, "cp_size": 1,
              "num_tokens": step.tokens, "num_tokens_for_logprob": requests,
              "can_run_decode_cuda_graph": step.mode != "extend",
              "can_run_draft_cuda_graph": True,
              "can_run_prefill_cuda_graph": step.mode == "idle",
              "is_extend_in_batch": step.mode == "extend", "local_can_run_tbo": False,
              "local_forward_mode": mode.value}
    # the fields the release's row has (older releases: dp_size, no draft-graph vote); a
    # required one not known here fails in the constructor, naming it
    parameters = inspect.signature(MLPSyncBatchInfo).parameters
    info = MLPSyncBatchInfo(**{k: v for k, v in fields.items() if k in parameters})
    return info._get_local_tensor(device="cpu")


class ScriptedPeerGroup:
    """The tensor-parallel group's CPU process group, two ranks: this one and a scripted
    peer. ``clock()`` is the loop's iteration; ``script`` maps iterations to the peer's
    step (absent: idle). Each iteration may gather once."""

    def __init__(self, script: dict[int, PeerStep], last_iteration: int,
                 clock: Callable[[], int]) -> None:
        self.script = script
        self.last_iteration = last_iteration
        self.clock = clock
        self.gathered: dict[int, PeerStep] = {}  # iteration -> the peer step answered

    def get_world_size(self, group: Any = None) -> int:
        """``torch.distributed.get_world_size``: 2 for this group; any other group is
        unplanned."""
        if group is not self:
            raise UnplannedUseError(f"torch.distributed.get_world_size({group!r}): only the "
                                    "scripted DP group is planned")
        return DP_RANKS

    def all_gather_single(self, output: torch.Tensor, local: torch.Tensor, group: Any = None,
                          async_op: bool = False) -> None:
        """The sync rows' all-gather: ``output`` gets this rank's row, then the peer's."""
        iteration = self.clock()
        if group is not self or async_op:
            raise UnplannedUseError(f"all_gather_single(group={group!r}, async_op={async_op})"
                                    ": only a blocking gather on the scripted DP group is "
                                    "planned")
        if iteration in self.gathered or not 0 <= iteration <= self.last_iteration:
            raise UnplannedUseError(f"DP sync-row gather in iteration {iteration}: one per "
                                    f"iteration 0..{self.last_iteration} is planned")
        step = self.script.get(iteration, IDLE)
        row = peer_row(step)
        if output.numel() != DP_RANKS * local.numel() or row.numel() != local.numel():
            raise UnplannedUseError(f"DP sync-row gather of {local.numel()} values into "
                                    f"{output.numel()}: the peer's row has {row.numel()}")
        rows = output.view(DP_RANKS, -1)
        rows[0] = local
        rows[1] = row.to(output.dtype)
        self.gathered[iteration] = step

    def __repr__(self) -> str:
        return "ScriptedPeerGroup(tp cpu group)"
