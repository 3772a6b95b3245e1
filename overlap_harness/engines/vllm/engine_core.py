"""vLLM's engine core driving the steps: ``EngineCore.step_with_batch_queue`` with the real
``AsyncScheduler`` and ``UniProcExecutor``, and a fake worker whose steps are Model Runner
V2's own pieces (``StagedWriteTensor`` over the ``UvaBufferPool`` ring, ``AsyncOutput``).

So how many steps are in flight, and when a step's output is taken (the executor's
``AsyncOutputFuture.result()`` calls ``get_output()``), is vLLM's decision, not the driver's.
Built strictly: the engine core and the executor are made with ``__new__`` and given only
the fields these methods read; the scheduler's model config is a strict stub of the seven
fields the scheduler reads (anything else raises with its name); the worker has exactly the
two methods the executor calls.
"""

from __future__ import annotations

import os
import queue
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import watch

MAX_REQS, BLOCK_SIZE, VOCAB = 4, 4, 16
MODEL_CONFIG_FIELDS = {  # what Scheduler.__init__ and schedule() read of the model config
    "uses_mrope": False, "is_encoder_decoder": False, "max_model_len": 64,
    "multimodal_config": None, "runner_type": "generate", "is_diffusion": False,
    "supports_multimodal_inputs": False, "return_sampling_mask": False,
}


def _no_grammar(request: Any, new_token_ids: list[int]) -> bool:
    """The structured-output manager's answer for requests without a grammar (the only
    ones driven): every token accepted."""
    if request.use_structured_output:
        raise UnplannedUseError(f"{request.request_id}: structured output is not driven")
    return True


@contextmanager
def model_runner_v2_chosen() -> Iterator[None]:
    """Inside, vLLM's config answers ``use_v2_model_runner`` True (``VLLM_USE_V2_MODEL_RUNNER=1``,
    what a CUDA build with Triton chooses by itself); the variable is restored after. Only
    around the questions: building a ``VllmConfig`` with it refuses, as the CPU build has no
    Triton."""
    saved = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved


@contextmanager
def triton_answered() -> Iterator[None]:
    """Inside, ``vllm.triton_utils.HAS_TRITON`` is True, as on a CUDA build, where the tree
    has the flag: from 0.34.0 on, vLLM's CPU platform (the host platform the config is
    checked on, :func:`~.environment.host_platform_chosen`) refuses an x86 machine without
    triton-cpu ("vLLM on x86 CPUs requires Triton"). Only around building the config: no
    Triton kernel runs (the ones the driven paths launch are declared, :mod:`.kernels`)."""
    import vllm.triton_utils

    if not hasattr(vllm.triton_utils, "HAS_TRITON") or vllm.triton_utils.HAS_TRITON:
        yield
        return
    with attributes_set([(vllm.triton_utils, "HAS_TRITON", True)]):
        yield


def async_scheduler(batch_queue_size: int, max_num_batched_tokens: int = 64,
                    pipeline_parallel_size: int = 1, model_runner_v2: bool = False) -> Any:
    """vLLM's ``AsyncScheduler`` on a small KV cache (32 blocks of 4 tokens); chunked prefill
    is on (vLLM's default), so a prompt longer than ``max_num_batched_tokens`` (less the
    decodes beside it) is scheduled in chunks. ``pipeline_parallel_size`` sets the parallel
    config the scheduler and ``max_concurrent_batches`` read; ``model_runner_v2``: the
    scheduler is made for Model Runner V2 (:func:`model_runner_v2_chosen`)."""
    from vllm.config import SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    with triton_answered():
        config = VllmConfig(scheduler_config=SchedulerConfig(
            max_num_seqs=MAX_REQS, max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=64, is_encoder_decoder=False, async_scheduling=True,
            enable_chunked_prefill=True))
    # the CPU platform turns async scheduling off while the config is built ("not required
    # on CPU"); the CUDA platform keeps it, and the scheduler and the batch queue's depth
    # read it
    config.scheduler_config.async_scheduling = True
    config.parallel_config.pipeline_parallel_size = pipeline_parallel_size
    config.cache_config.num_gpu_blocks = 32
    config.cache_config.enable_prefix_caching = False  # requests carry no block hasher
    object.__setattr__(config, "model_config", StrictStub("model_config",
                                                          **MODEL_CONFIG_FIELDS))
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    kv_cache = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    with model_runner_v2_chosen() if model_runner_v2 else nullcontext():
        scheduler = AsyncScheduler(vllm_config=config, kv_cache_config=kv_cache,
                                   structured_output_manager=StrictStub(
                                       "structured_outputs", accept_tokens=_no_grammar),
                                   block_size=BLOCK_SIZE)
    return scheduler, config


class FakeWorker:
    """The worker the executor calls: ``execute_model`` stages this step's block-table rows
    and applies them (the write kernel reads the UVA ring), then runs the fake forward;
    ``sample_tokens`` samples and returns Model Runner V2's ``AsyncOutput``."""

    def __init__(self, device: torch.device, ring_depth: int | None) -> None:
        from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

        self.device = device
        self.block_table = StagedWriteTensor((MAX_REQS, 16), torch.int32, device,
                                             max_concurrency=ring_depth)
        self.rows: dict[str, int] = {}
        self.logits = torch.zeros(MAX_REQS, VOCAB, device=device)
        self.main_stream = torch.cuda.current_stream()
        self.copy_stream = torch.cuda.Stream()
        self.batch: list[str] = []

    def execute_model(self, scheduler_output: Any) -> Any:
        for new in scheduler_output.scheduled_new_reqs:
            self.rows[new.req_id] = min(set(range(MAX_REQS)) - set(self.rows.values()))
            self.block_table.stage_write(self.rows[new.req_id], 0, new.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                                cached.num_computed_tokens, strict=True):
            if new_blocks is not None and new_blocks[0]:
                start = computed // BLOCK_SIZE
                self.block_table.stage_write(self.rows[req_id], start, new_blocks[0])
        for req_id in scheduler_output.finished_req_ids:
            self.rows.pop(req_id, None)
        self.block_table.apply_write()
        self.batch = list(scheduler_output.num_scheduled_tokens)
        if not self.batch:  # nothing scheduled: the runner answers with the empty output
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            return EMPTY_MODEL_RUNNER_OUTPUT
        first, last = self._row_span()
        table = self.block_table.gpu[first:last, :1].float()  # the forward reads the rows
        self.logits[first:last].add_(table)
        return None

    def _row_span(self) -> tuple[int, int]:
        """Rows of this batch, as one slice (a device index built from a host list would
        be a blocking copy, which the real runner does not make)."""
        rows = [self.rows[r] for r in self.batch]
        return min(rows), max(rows) + 1

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.worker.gpu.async_utils import AsyncOutput
        from vllm.v1.worker.gpu.sample.output import SamplerOutput

        from overlap_harness.engines.vllm.drivers import runner_output

        first, last = self._row_span()
        sampled = self.logits[first:last].argmax(dim=-1, keepdim=True).to(torch.int32)
        count = torch.ones(last - first, dtype=torch.int32, device=self.device)
        sampler_output = SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None,
                                       num_nans=None, num_sampled=count,
                                       num_rejected=torch.zeros_like(count))
        output = runner_output(self.batch)
        return AsyncOutput(output, sampler_output, count, self.main_stream, self.copy_stream,
                           check_ep_fault=False, pending_aux_output=None)


def engine_steps(num_requests: int = 3, max_tokens: int = 4, batch_queue_size: int = 2,
                 ring_depth: int | None = None, max_calls: int = 40) -> Any:
    """Requests prefilled and decoded by ``step_with_batch_queue`` until done. Returns the
    watch, with ``w.finished`` the ids of the requests the engine reported finished."""
    import_vllm()
    from vllm.v1.worker.gpu import buffer_utils

    scheduler, config = async_scheduler(batch_queue_size)  # host objects: built first, on
    # the platform vLLM found (its config checks ask it dozens of unrelated questions)
    with watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils):
        worker = FakeWorker(torch.device("cuda"), ring_depth)
        prompts = [[1, 2, 3, 4, 5][: 3 + index] for index in range(num_requests)]
        w.finished = drive_engine(w, scheduler, config, worker, prompts, max_tokens,
                                  batch_queue_size, max_calls)
    return w


def drive_engine(w: Any, scheduler: Any, config: Any, worker: Any,
                 prompts: list[list[int]], max_tokens: int, batch_queue_size: int,
                 max_calls: int = 40) -> set[str]:
    """Add one request per prompt (``req0``...) and call ``step_with_batch_queue`` until
    the scheduler and the queue are empty; each call is an iteration of the watch ``w``
    (the timeline plot draws one). Returns the ids the engine reported finished."""
    from vllm import SamplingParams
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.uniproc_executor import UniProcExecutor
    from vllm.v1.request import Request

    executor = UniProcExecutor.__new__(UniProcExecutor)
    executor.driver_worker = worker
    engine = EngineCore.__new__(EngineCore)
    engine.scheduler, engine.model_executor, engine.vllm_config = scheduler, executor, config
    engine.batch_queue, engine.batch_queue_size = deque(), batch_queue_size
    engine.is_mm_encoder_only = engine.is_pooling_model = engine.log_stats = False
    engine.aborts_queue = queue.Queue()
    engine._weight_version = None
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        scheduler.add_request(Request(f"req{index}", prompt, params, None))
    finished: set[str] = set()
    for call in range(max_calls):
        if not scheduler.has_requests() and not engine.batch_queue:
            break
        w.iteration(call)
        outputs, _executed = engine.step_with_batch_queue()
        for engine_outputs in (outputs or {}).values():
            finished |= {o.request_id for o in engine_outputs.outputs if o.finished}
    return finished
