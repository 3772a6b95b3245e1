"""SGLang's DSpark confidence relay under the driven loop: the scheduler's own FutureMap with
``needs_confidence_relay``, fed by a DSpark worker whose model forwards are faked.

With the DSPARK speculative algorithm and a ragged verify mode that is not ``static``
(``SGLANG_RAGGED_VERIFY_MODE``), SGLang's ``Scheduler.init_overlap`` builds the FutureMap with
``needs_confidence_relay=True`` (``decide_needs_confidence_relay``) and takes the draft
worker's ``get_confidence_budget_prepare()``, which ``run_batch`` calls on the schedule stream
before each forward. Each decode's ``on_publish(new_seq_lens, confidence=...)`` scatters the
draft's confidence into ``ConfidenceRelay.confidence_buf`` and issues the ring copy on
FutureMap's private D2H stream (``issue_ring_copy``: ``wait_event(publish_ready)``, the copy
into a pinned ring slot, ``copy_done[slot].record()``); two steps later the budget prepare's
``resolve_confidence_cpu`` asks ``copy_done[slot].query()`` and reads the slot on the host.

SGLang's own code, unmodified: the ``Scheduler`` and its whole overlap loop
(:mod:`.scheduler_build`, :mod:`.driver`), ``decide_needs_confidence_relay``,
``read_ragged_verify_mode``, ``SpeculativeAlgorithm.create_future_map``, ``FutureMap``
(``publish``, ``stash``, ``resolve_seq_lens_cpu``, ``resolve_forward_inputs``,
``resolve_confidence_cpu``) and its ``ConfidenceRelay``, ``DFlashDraftInputV2`` (its
``prepare_for_decode``: the over-allocated verify window, ``filter_batch``, ``merge_batch``),
``make_next_draft_input``, and the verify planner the real worker builds,
``DSparkVerifyPlanner`` with its ``HostConfidenceBudgetPlanner`` (``prepare_verify_budget``,
``confidence_budget_prepare``, ``resolve_verify_token_budget``, ``note_non_decode_step``,
``compute_budget``: the host's reader of the relayed confidence).

The harness's: the worker where SGLang's ``DSparkWorkerV2`` stands, with the model forwards
as declared ops
(:class:`~overlap_harness.engines.sglang.stand_ins.dspark_worker.DsparkWorker`). Not
driven: the proposer, verify executor and epilogue, CUDA graphs, the KV injection into the
draft pool, the ragged layout (``schedule_layout``) and the observers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature, on_off
from overlap_harness.engines.sglang.scheduler_build import DEVICE, PoolSizes
from overlap_harness.engines.sglang.stand_ins import eagle_kernels, eagle_models
from overlap_harness.engines.sglang.stand_ins.dspark_worker import DsparkWorker
from overlap_harness.engines.sglang.stand_ins.model_worker import FakeRunner

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


#: spec-v2 modules whose import-time platform flags choose branches on the DSpark path
SPEC_FLAGGED_MODULES = ("sglang.srt.speculative.spec_utils",
                        "sglang.kernels.ops.speculative.cache_locs")


class RaggedVerify(StrEnum):
    """SGLang's ragged verify modes (``SGLANG_RAGGED_VERIFY_MODE``, ragged_verify.py's
    ``RaggedVerifyMode`` values): every mode but ``static`` relays the draft confidence."""

    STATIC = "static"
    CAP_ACCEPT = "cap-accept"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class Dspark(Feature):
    """SGLang's DSpark spec v2 (``--speculative-algorithm DSPARK``) with its confidence relay,
    its options as SGLang's server arguments and switches."""

    keys: ClassVar[tuple[str, ...]] = ("speculative", "plan_stream", "ragged_verify",
                                       "cpu_seq_lens")
    options: ClassVar[tuple[str, ...]] = (
        "--speculative-algorithm DSPARK", "--speculative-dspark-block-size",
        "SGLANG_RAGGED_VERIFY_MODE", "the attention backend's needs_cpu_seq_lens")
    speculative: ClassVar[bool] = True

    gamma: int = 3  # --speculative-dspark-block-size: draft tokens per step
    ragged_verify_mode: RaggedVerify = RaggedVerify.CAP_ACCEPT
    # what the attention backends declare: DeepSeek-V4's backend under DSpark says False
    # (resolve_seq_lens_cpu then skips its D2H pull); a backend without the flag, True
    needs_cpu_seq_lens: bool = True

    @property
    def verify_tokens(self) -> int:
        """``speculative_num_draft_tokens``: the verify window, the anchor and gamma drafts."""
        return self.gamma + 1

    def configuration(self, variant: Variant) -> dict[str, str]:
        # plan_stream: DFlashDraftInputV2 reads the same switch, unset
        return {"speculative": "dspark", "plan_stream": "off",
                "ragged_verify": self.ragged_verify_mode.value,
                "cpu_seq_lens": on_off(self.needs_cpu_seq_lens)}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        needs = [rf.DSPARK_CONFIDENCE_RELAY, rf.DSPARK_VERIFY_BUDGET, rf.DFLASH_DRAFT_INPUT]
        return needs + ([rf.SEQ_LENS_D2H] if self.needs_cpu_seq_lens else [])

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (eagle_kernels.declare,)  # the spec-v2 allocation and relay kernels it shares

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        """The fields ``_handle_dspark`` would resolve, given explicitly: top-k 1, one step,
        gamma + 1 verify tokens."""
        options.update(device=DEVICE, disable_cuda_graph=True, speculative_algorithm="DSPARK",
                       speculative_dspark_block_size=self.gamma,
                       speculative_num_draft_tokens=self.verify_tokens,
                       speculative_num_steps=1, speculative_eagle_topk=1,
                       max_running_requests=variant.pools.request_rows)

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return selected(self)

    def spec_workers(self, variant: Variant) -> Callable[[Any, Any], None]:
        return lambda scheduler, sizes: build_workers(scheduler, sizes, self)


def _target(scheduler: Any, sizes: PoolSizes, config: Dspark) -> Any:
    """The target worker: :mod:`.stand_ins.eagle_models`'s prefill forward over a runner whose
    backend declares ``needs_cpu_seq_lens`` as the configuration says."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    pool, allocator = scheduler.req_to_token_pool, scheduler.token_to_kv_pool_allocator
    runner = FakeRunner(pool, allocator)
    runner.attn_backend = StrictStub("attn_backend", needs_cpu_seq_lens=config.needs_cpu_seq_lens,
                                     absent=("extend_attention_block_m",))
    runner.spec_algorithm = SpeculativeAlgorithm.from_string("DSPARK")
    runner.is_draft_worker = False
    target = eagle_models.FakeTargetWorker(pool, allocator, sizes.kv_tokens, runner)
    target.random_seed = 0
    return target


def build_workers(scheduler: Any, sizes: PoolSizes, config: Dspark) -> None:
    """Give ``scheduler`` the DSpark worker (its ``spec_algorithm``, ``tp_worker``,
    ``draft_worker``, ``model_worker``), before ``init_overlap`` builds the FutureMap."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    target = _target(scheduler, sizes, config)
    worker = DsparkWorker(target, config, scheduler.server_args)
    scheduler.spec_algorithm = SpeculativeAlgorithm.from_string("DSPARK")
    scheduler.tp_worker = target
    scheduler.draft_worker = scheduler.model_worker = worker


@contextmanager
def selected(config: Dspark) -> Iterator[None]:
    """The ragged verify mode (``SGLANG_RAGGED_VERIFY_MODE``) and the CUDA branches of the
    spec-v2 helpers (:data:`SPEC_FLAGGED_MODULES`)."""
    import importlib

    from sglang.srt.environ import envs

    for name in SPEC_FLAGGED_MODULES:
        importlib.import_module(name)
    flags = [(sys.modules[name], flag, flag == "_is_cuda") for name in SPEC_FLAGGED_MODULES
             for flag in ("_is_cuda", "_is_hip") if hasattr(sys.modules[name], flag)]
    with attributes_set(flags), envs.SGLANG_RAGGED_VERIFY_MODE.override(
            config.ragged_verify_mode.value):
        yield
