"""The model under SGLang's eager runner, as the harness declares it (the feature:
:mod:`..features.eager_prefill`): the model-runner fields the runner reads
(:class:`EagerModelRunner`, with SGLang's own ``ModelRunner`` methods bound to it), its
attention backend and model body (:mod:`.prefill_backend`), and the worker's forwards
through the runner, then the graph path's declared sampler (:class:`EagerForwards`).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.sglang.stand_ins.graph_model import GraphModelRunner, _sample
from overlap_harness.engines.sglang.stand_ins.prefill_backend import (
    EagerModel,
    pre_replay_backend_class,
)

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
    sampled (the runner is built by
    :func:`~overlap_harness.engines.sglang.features.eager_prefill.build_forwards`)."""

    def __init__(self, model_runner: EagerModelRunner, runner: Any) -> None:
        self.model_runner = model_runner
        self.runner = runner
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
