"""Forwards through SGLang's own ``EagerRunner`` with a backend whose prefill reads end early.

The runner is SGLang's class, built by its own ``__init__`` (the eager static-input registry,
``build_eager_registry``) and run by its own ``execute``: ``load_batch`` copies each batch
into the registry's buffers on the forward stream; ``_execute_extend`` then calls the
attention backend's ``init_forward_metadata``, asks it where the prefill's scheduler-shared
reads end (``resolve_prefill_shared_read_ends``, SGLang's base-class method) and hands the
answer to SGLang's ``maybe_publish_prefill_shared_read_done``, which records the read-done
event on the forward stream and publishes it on the model runner, where the scheduler's WAR
barrier (``Scheduler._apply_war_barrier``) takes it instead of waiting on the whole forward
stream. Decode batches go through the same runner's ``_execute_decode`` (no event: the barrier
waits on the forward stream).

What is the harness's (no weights, no attention kernels; :mod:`.stand_ins.prefill_backend`,
:mod:`.stand_ins.eager_model`): the attention backend, a subclass of SGLang's
``AttentionBackend`` declaring ``PRE_REPLAY`` for EXTEND (as TRT-LLM MHA does) whose
``init_forward_metadata`` is the forward's only read of the scheduler-shared ``req_to_token``
rows; the model body, one declared op; the model-runner fields the runner reads; then the
graph path's declared sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.decode_graph import (
    graph_platform,
)
from overlap_harness.engines.sglang.stand_ins import graph_kernels
from overlap_harness.engines.sglang.stand_ins.eager_model import EagerForwards, EagerModelRunner
from overlap_harness.engines.sglang.stand_ins.eagle_kernels import _positions, _positions_accesses

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


def build_forwards(worker: Any, server_args: Any, parallel_state: Any = None
                   ) -> EagerForwards:
    """SGLang's ``EagerRunner``, built by its own ``__init__`` over the harness's model runner
    (:class:`~overlap_harness.engines.sglang.stand_ins.eager_model.EagerForwards` runs it)."""
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    fake = worker.model_runner
    model_runner = EagerModelRunner(
        worker.req_to_token_pool, fake.token_to_kv_pool_allocator, worker.kv_buffer,
        fake.ngram_embedding_manager, server_args)
    if parallel_state is not None:
        model_runner.ps = parallel_state
    with graph_platform():
        runner = EagerRunner(model_runner)
    model_runner.eager_runner = runner
    return EagerForwards(model_runner, runner)


@contextmanager
def fastpath_enabled(on: bool) -> Iterator[None]:
    """``SGLANG_ENABLE_PREFILL_WAR_READ_DONE`` set for the block when ``on``: SGLang's switch
    of the prefill read-done fastpath (on by default where the release defaults it so, off in
    releases that ship it opt-in)."""
    if not on:
        yield
        return
    from sglang.srt.environ import envs

    with envs.SGLANG_ENABLE_PREFILL_WAR_READ_DONE.override(True):
        yield


def declare() -> None:
    """Register the declarations the eager prefill path needs (idempotent; before the
    watch): the extend positions' Triton kernel ``ForwardBatch.init_new`` launches."""
    recorder.declare_kernel("sglang.srt.model_executor.forward_batch_info:"
                            "compute_position_triton", _positions_accesses,
                            cpu_impl=_positions, name="compute_position_kernel")


def attach(scheduler: Any, server_args: Any) -> EagerForwards:
    """Give the scheduler's fake worker SGLang's eager runner (built at startup, as
    ``ModelRunner`` builds it before the loop starts)."""
    worker = scheduler.model_worker
    forwards = build_forwards(worker, server_args, getattr(scheduler, "ps", None))
    worker.eager_forwards = forwards
    return forwards


@dataclass(frozen=True, slots=True)
class EagerPrefillReadDone(Feature):
    """Every forward run by SGLang's eager runner, its attention backend declaring a
    prefill's shared reads ended in its metadata init (``PRE_REPLAY``, as TRT-LLM MHA's):
    each prefill publishes its read-done event early (``SGLANG_ENABLE_PREFILL_WAR_READ_DONE``)."""

    keys: ClassVar[tuple[str, ...]] = ("attention_reads_end",)
    options: ClassVar[tuple[str, ...]] = ("SGLANG_ENABLE_PREFILL_WAR_READ_DONE",
                                          "--attention-backend (its SharedReadEnds)")
    fake_runner: ClassVar[bool] = False  # the runner is SGLang's

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"attention_reads_end": "pre_replay"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.EAGER_PREFILL_READ_DONE]

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        return (graph_kernels.declare, declare)

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return fastpath_enabled(True)

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        attach(scheduler, server_args)
