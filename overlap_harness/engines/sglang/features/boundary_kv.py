"""The multi-layer EAGLE worker's boundary-KV window, turned on where the tree has it.

SGLang's ``MultiLayerEagleDraftWorker`` widens each draft extend by ``front`` rows below the
committed length (``num_steps - 1`` plus the conv state's warm-up rows), fed from a
per-request stash of the last committed (token, hidden) pairs, when
``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX`` is on (its default), topk is 1, there is more than one
step, draft and target hidden sizes agree and the request pool is a
``HybridReqToTokenPool`` (a mamba / linear-attention hybrid model): its
``_init_boundary_kv_fix_state``, called at the end of ``alloc_memory_pool``. With the window
on, the decode's ``_draft_extend_for_decode`` computes the window's KV slots and positions
(``_compute_boundary_kv_locs_positions``) on the forward stream, records
``boundary_kv_ready_event`` there and makes the plan stream wait on it before the draft
extend's preparation; after the plan stream's join, ``_fill_boundary_kv_front_and_update_stash``
fills the front rows and rolls the stash; a prefill's draft extend seeds the stash
(``_seed_boundary_kv_stash``).

What is SGLang's here: all of that, and the window's own decision (this feature only gives it
what it asks for, and the run fails if SGLang leaves the window off). The harness's
(``stand_ins/``): the hybrid pool, a view of the scheduler's pool as a
``HybridReqToTokenPool`` with a conv state's shape (``hybrid_pool.py``), handed to the worker's
own ``alloc_memory_pool`` as the scheduler hands its pool; the window's three Triton kernels,
declared (``boundary_kv_kernels.py``); the hidden size both model configurations report
(the fake forwards' width). Eager, or under the multi-layer draft-extend CUDA graphs when
composed with :class:`.multi_layer_draft_extend_graph.CudaGraphMultiLayerDraftExtend`
(SGLang's runner captures the widened width). Not driven: the scheduler's mamba paths of a
hybrid model (its pool stays the plain one), a draft extend staged before the verify. Found
by feature: a tree whose worker has no ``_init_boundary_kv_fix_state`` or whose memory pool
has no ``HybridReqToTokenPool`` lists the variant as not applicable
(``release_features.MULTI_LAYER_BOUNDARY_KV``, ``HYBRID_REQUEST_POOL``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins import boundary_kv_kernels, eagle_models
from overlap_harness.engines.sglang.stand_ins.hybrid_pool import hybrid_pool_view

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


@contextmanager
def _window_switch() -> Iterator[None]:
    """``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX`` on (its default), whatever the environment."""
    from sglang.srt.environ import envs

    with envs.SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX.override(True):
        yield


@dataclass(frozen=True, slots=True)
class BoundaryKvWindow(Feature):
    """The multi-layer EAGLE worker's boundary-KV window (``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX``,
    on by default, with a hybrid model's request pool): each draft extend widened by front rows
    fed from a per-request stash. Needs :class:`.multi_layer_eagle.MultiLayerEagle`."""

    keys: ClassVar[tuple[str, ...]] = ("boundary_kv",)
    options: ClassVar[tuple[str, ...]] = ("SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX",
                                          "a hybrid (mamba / linear-attention) MTP model")

    def configuration(self, variant: Variant) -> dict[str, str]:
        # the window is the multi-layer worker's: the speculative feature keyed
        # multi_layer_eagle (MultiLayerEagle, which imports this module)
        worker = variant.speculative
        if worker is None or "multi_layer_eagle" not in worker.keys:
            raise ValueError(f"variant {variant.name}: BoundaryKvWindow needs MultiLayerEagle")
        return {"boundary_kv": "on"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.MULTI_LAYER_BOUNDARY_KV, rf.HYBRID_REQUEST_POOL]

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (boundary_kv_kernels.declare,)

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return _window_switch()

    def worker_pool(self, plain: Any, target: Any, step_runners: list[Any]) -> Any:
        """The request pool the multi-layer worker's ``alloc_memory_pool`` is given: the
        scheduler's ``plain`` pool seen as a hybrid model's; the hidden size and dtype the
        window's stash is made of set on the fake target's and step runners' fields."""
        target.model_runner.model_config.hidden_size = eagle_models.HIDDEN
        for runner in step_runners:
            runner.model_config.hidden_size = eagle_models.HIDDEN
            runner.dtype = torch.float32
        return hybrid_pool_view(plain)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        """Check that SGLang turned the window on (its own decision, at ``alloc_memory_pool``):
        a run that would drive the plain path instead fails."""
        draft = scheduler.draft_worker.draft_worker
        if not draft.draft_extend_num_front_tokens:
            raise RuntimeError("the multi-layer draft worker left the boundary-KV window off "
                               "(_init_boundary_kv_fix_state declined the hybrid pool)")
