"""One attention-DP rank of SGLang's overlap loop, beside a scripted peer rank.

With attention data parallelism (``--tp-size 2 --attn-dp-size 2``) every scheduler gathers,
once per iteration, what each DP rank is about to run (SGLang's ``prepare_mlp_sync_batch_raw``
in ``managers/scheduler_components/dp_attn.py``): its token count, its forward mode and its
CUDA-graph votes. A rank with nothing of its own while a peer has tokens runs an IDLE batch
(``get_idle_batch``): an empty forward, so the MoE layers' collectives meet the peer's.

The driven scheduler is rank 0; the peer (rank 1) is a script: per iteration, the forward
mode and token count it reports. Its gathered row is made by SGLang's own
``MLPSyncBatchInfo`` from the votes the peer's scheduler would cast for that batch under the
same options (see :func:`peer_row`). The process group is :class:`ScriptedPeerGroup`, a strict
fake: the one collective planned (the all-gather of the sync rows, once per iteration) answers
with the scripted row; every other ``torch.distributed`` collective, or a second gather in one
iteration, or an iteration the script does not cover, raises ``UnplannedUseError``.

The fake model worker of a DP rank (:class:`DPRankModelWorker`) decides CUDA-graph replay as
SGLang's model runner does under DP attention: decode and idle batches replay the decode
graph only when every rank voted for it (``batch.can_run_decode_cuda_graph``, the gathered
minimum), and a replay publishes the runner's read-done event, idle ones included. An idle
forward touches no memory the scheduler shares: its inputs are empty, so its declared op
reads and writes nothing (the MLP's gather buffers are the model's own, and a padded graph
replay's rows point at ``ReqToTokenPool``'s padding row 0, which no request is given).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError, unplanned
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins.model_worker import FakeModelWorker

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

#: the DP width driven: this rank and one scripted peer
DP_RANKS = 2
DP_ATTN_MODULE = "sglang.srt.managers.scheduler_components.dp_attn"

#: ``torch.distributed`` functions the driven loop must not call (the sync-row all-gather and
#: the world size of its group are the planned ones)
_UNPLANNED_COLLECTIVES = (
    "all_gather_single", "all_gather_into_tensor", "all_gather", "all_gather_object",
    "all_reduce", "broadcast", "broadcast_object_list", "gather", "scatter", "reduce",
    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "get_rank", "get_global_rank")


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


def _collective_bindings() -> list[tuple[Any, str, Any]]:
    """Every binding of an unplanned ``torch.distributed`` collective, in ``torch.distributed``
    itself and in the loaded sglang modules that imported one by name, made to raise."""
    originals = {id(getattr(dist, name)): name for name in _UNPLANNED_COLLECTIVES
                 if hasattr(dist, name)}
    patches: list[tuple[Any, str, Any]] = [
        (dist, name, unplanned(f"torch.distributed.{name}")) for name in originals.values()]
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("sglang.") or module is None:
            continue
        for attribute, value in list(vars(module).items()):
            if callable(value) and id(value) in originals:
                patches.append((module, attribute,
                                unplanned(f"{module_name}.{attribute} (torch.distributed."
                                          f"{originals[id(value)]})")))
    return patches


@contextmanager
def _peer_installed(group: ScriptedPeerGroup, scheduler: Any) -> Iterator[ScriptedPeerGroup]:
    from sglang.srt.runtime_context import get_parallel

    dp_attn = sys.modules[DP_ATTN_MODULE]
    tp_group = StrictStub("tp_group", cpu_group=group, world_size=DP_RANKS,
                          active_ranks_cpu=torch.ones(DP_RANKS, dtype=torch.int32))
    patches = _collective_bindings()
    # the sync rows' gather, where the release calls it: SGLang's all_gather_single helper,
    # or (older releases) torch.distributed's all_gather_into_tensor itself
    patches += [(dist, "get_world_size", group.get_world_size),
                (dist, "all_gather_into_tensor", group.all_gather_single)]
    if hasattr(dp_attn, "all_gather_single"):
        patches.append((dp_attn, "all_gather_single", group.all_gather_single))
    # where the release reads the group: its parallel context (below), or (older releases)
    # parallel_state's get_tp_group and the group the scheduler and its DP adapter keep
    if hasattr(dp_attn, "get_tp_group"):
        patches.append((dp_attn, "get_tp_group", lambda: tp_group))
    keeps_group = scheduler is not None and "tp_group" in vars(scheduler)
    if keeps_group:
        patches.append((scheduler, "tp_group", tp_group))
    with attributes_set(patches), get_parallel().override(tp_group=tp_group):
        if keeps_group:  # its DP adapter took the group when made: made again with this one
            from overlap_harness.engines.sglang.scheduler_build import own_init

            own_init(scheduler, "init_dp_attn_adapter")
        yield group


def peer_installed(script: dict[int, PeerStep] | None, last_iteration: int,
                   clock: Callable[[], int], scheduler: Any = None
                   ) -> AbstractContextManager[ScriptedPeerGroup | None]:
    """The scripted peer rank and its process group for the block (nothing for None): the
    tensor-parallel group SGLang reads is a strict stub holding the scripted CPU group."""
    if script is None:
        return nullcontext()
    return _peer_installed(ScriptedPeerGroup(script, last_iteration, clock), scheduler)


class DPRankModelWorker(FakeModelWorker):
    """The fake worker of an attention-DP rank: CUDA-graph replay of decode and idle batches
    when every rank voted for it (module docstring); the read-done event published after
    each replay, as SGLang's decode graph runner publishes it."""

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_tokens: int, *,
                 graph_runner: bool) -> None:
        super().__init__(req_to_token_pool, allocator, kv_tokens, graph_runner=False)
        self.captures_decode_graphs = graph_runner
        # what the DP sync reads of the target runner: no speculative algorithm
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.model_runner.spec_algorithm = SpeculativeAlgorithm.from_string(None)
        self.launched: list[tuple[str, int, bool]] = []  # (mode, requests, graph replay)

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        """The base worker's forward (an idle batch's is empty), then what the graph runner
        publishes when the gathered vote let it replay."""
        mode = batch.forward_mode
        replays = (self.captures_decode_graphs and mode.is_decode_or_idle()
                   and bool(_graph_vote(batch)))
        result = super().forward_batch_generation(batch, **kwargs)
        if replays:
            event = torch.cuda.Event()
            event.record()
            self.model_runner.shared_read_done_event = event
        self.launched.append((mode.name, batch.batch_size(), replays))
        result.can_run_cuda_graph = replays
        return result


def _graph_vote(batch: Any) -> Any:
    """The gathered vote for a decode-graph replay, under the name the release's
    ``ScheduleBatch`` gives it (``can_run_decode_cuda_graph``; 0.5.17:
    ``can_run_dp_cuda_graph``)."""
    for name in ("can_run_decode_cuda_graph", "can_run_dp_cuda_graph"):
        if hasattr(batch, name):
            return getattr(batch, name)
    raise AttributeError("ScheduleBatch has neither can_run_decode_cuda_graph nor "
                         "can_run_dp_cuda_graph (the DP ranks' gathered graph vote)")


@dataclass(frozen=True, slots=True)
class DpAttention(Feature):
    """Attention data parallelism (tp 2, attn-dp 2): this rank beside a peer whose steps are
    scripted per iteration (``peer``; absent iterations: the peer is idle)."""

    keys: ClassVar[tuple[str, ...]] = ("dp_attention",)
    options: ClassVar[tuple[str, ...]] = ("--enable-dp-attention", "--dp-size", "--tp-size")

    peer: dict[int, PeerStep] = field(default_factory=dict)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"dp_attention": "on"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.DP_ATTENTION_SYNC]

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        from sglang.srt.server_args import ServerArgs

        from overlap_harness.engines.sglang.scheduler_build import dp_attention_arguments

        options.update(dp_attention_arguments(ServerArgs))

    def worker_class(self, variant: Variant) -> type | None:
        return DPRankModelWorker

    def loop(self, scheduler: Any, variant: Variant, iteration: Callable[[], int]
             ) -> AbstractContextManager[Any]:
        return peer_installed(self.peer, variant.iterations - 1, iteration, scheduler)
