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

What is the harness's (no weights, no attention kernels; :mod:`.stand_ins.prefill_backend`): the
attention backend, a subclass of SGLang's ``AttentionBackend`` declaring ``PRE_REPLAY`` for
EXTEND (as TRT-LLM MHA does) whose ``init_forward_metadata`` is the forward's only read of
the scheduler-shared ``req_to_token`` rows; the model body, one declared op; the model-runner
fields the runner reads (:class:`EagerModelRunner`); then the graph path's declared sampler.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.features.decode_graph import (
    GraphModelRunner,
    _sample,
    graph_platform,
)
from overlap_harness.engines.sglang.stand_ins import graph_kernels
from overlap_harness.engines.sglang.stand_ins.eagle_kernels import _positions, _positions_accesses
from overlap_harness.engines.sglang.stand_ins.prefill_backend import (
    EagerModel,
    pre_replay_backend_class,
)

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


#: ModelRunner's own methods the fake runner runs (each where the loaded release has it): the
#: dispatch to the eager runner and what it and the eager runner call on the model runner
MODEL_RUNNER_METHODS = ("_forward_raw", "_prepare_eager_forward_batch",
                        "_maybe_execute_deferred_mamba_cow_and_clear", "_pp_kwargs",
                        "_extend_forward_kwargs")


class EagerModelRunner(GraphModelRunner):
    """The model-runner fields SGLang's eager runner reads (the graph runner's, with the
    pool sizes it sizes its registry by), its backend the PRE_REPLAY stand-in."""

    # the backend name ForwardBatch.init_new's extend positions go by (Triton's kernel for
    # any backend but the torch-native ones); TRT-LLM MHA's, whose read end the stand-in's is
    prefill_attention_backend_str = "trtllm_mha"
    support_pp = False
    is_generation = True
    kv_cache_dtype = torch.float32

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_buffer: torch.Tensor,
                 ngram_manager: Any, server_args: Any) -> None:
        super().__init__(req_to_token_pool, allocator, kv_buffer, ngram_manager, server_args,
                         post_replay=False)
        self.max_running_requests = req_to_token_pool.size
        self.max_total_num_tokens = kv_buffer.shape[0] - 1
        self.attn_backend = pre_replay_backend_class()(req_to_token_pool.req_to_token,
                                                       self.max_running_requests)
        self.model = EagerModel(self)
        # what ModelRunner._forward_raw reads on the way to the eager runner: no decode or
        # prefill graph runner, one pipeline stage (set: the eager runner, once built)
        self.decode_cuda_graph_runner = None
        self.prefill_cuda_graph_runner = None
        self.eager_runner: Any = None
        self.pp_group = StrictStub("pp_group", is_last_rank=True, world_size=1)
        for name in MODEL_RUNNER_METHODS:
            self._bind(name)

    def _bind(self, name: str) -> None:
        """SGLang's ``ModelRunner.name`` bound to this runner, where the release has it."""
        from sglang.srt.model_executor.model_runner import ModelRunner

        if hasattr(ModelRunner, name):
            setattr(self, name, types.MethodType(getattr(ModelRunner, name), self))


class EagerForwards:
    """The worker's forwards through SGLang's ``EagerRunner``: each batch a ``ForwardBatch``
    made by SGLang's ``ForwardBatch.init_new``, dispatched by SGLang's
    ``ModelRunner._forward_raw`` (bound to the fake runner) to the runner's ``execute``, then
    sampled."""

    def __init__(self, worker: Any, server_args: Any, parallel_state: Any = None) -> None:
        from sglang.srt.model_executor.runner.eager_runner import EagerRunner

        fake = worker.model_runner
        self.model_runner = EagerModelRunner(
            worker.req_to_token_pool, fake.token_to_kv_pool_allocator, worker.kv_buffer,
            fake.ngram_embedding_manager, server_args)
        if parallel_state is not None:
            self.model_runner.ps = parallel_state
        with graph_platform():
            self.runner = EagerRunner(self.model_runner)
        self.model_runner.eager_runner = self.runner
        self.extends = 0
        self.decodes = 0

    def forward(self, batch: Any) -> Any:
        """One forward of ``batch`` (a ``ModelWorkerBatch``) on the current stream; SGLang's
        ``GenerationBatchResult``."""
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        forward_batch = ForwardBatch.init_new(batch, self.model_runner,
                                              return_hidden_states_before_norm=False)
        if forward_batch.forward_mode.is_decode():
            self.decodes += 1
        else:
            self.extends += 1
        # SGLang's dispatch (its forward context, the eager-batch preparation, the runner)
        output = self.model_runner._forward_raw(forward_batch, None).logits_output
        return GenerationBatchResult(logits_output=output,
                                     next_token_ids=_sample(output.next_token_logits),
                                     can_run_cuda_graph=False)


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
    forwards = EagerForwards(worker, server_args, getattr(scheduler, "ps", None))
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
