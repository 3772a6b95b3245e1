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

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub, unplanned
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins.dp_peer import (
    DP_RANKS,
    PeerStep,
    ScriptedPeerGroup,
)
from overlap_harness.engines.sglang.stand_ins.dp_rank_worker import DPRankModelWorker

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


DP_ATTN_MODULE = "sglang.srt.managers.scheduler_components.dp_attn"


#: ``torch.distributed`` functions the driven loop must not call (the sync-row all-gather and
#: the world size of its group are the planned ones)
_UNPLANNED_COLLECTIVES = (
    "all_gather_single", "all_gather_into_tensor", "all_gather", "all_gather_object",
    "all_reduce", "broadcast", "broadcast_object_list", "gather", "scatter", "reduce",
    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "get_rank", "get_global_rank")


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
