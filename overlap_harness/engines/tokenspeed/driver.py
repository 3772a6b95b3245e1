"""TokenSpeed's own overlap loop driven under the recorder (CPU mode, CUDA faked).

What runs is TokenSpeed's: ``EventLoop.event_loop`` (one forward in flight, committed one
round behind), ``DeviceHandle.execute`` (every forward handed to the forward thread as a
closure), ``ForwardThread`` (one thread running all GPU work in FIFO order),
``ModelExecutor.execute_forward_op`` (the execution stream's wait on the default stream, the
input buffers' pinned uploads, the runtime-state updates, the clamp, the output copies and
the copy event), ``InputBuffers``, ``RuntimeStates``, ``CacheBatchMetadata`` and the
FlashInfer sampling backend's ``prepare_step`` (its coin refill through pinned memory) and
``get_packed_output_d2h``; the commit's ``PendingExecution.result()`` (the future, then the
copy event's ``synchronize``).

What stands in (:mod:`.stand_ins`): the forward below ``forward_step``, the kernels, the
scheduler's plans, the request states and hooks of the front end. The event loop and the
executor are made with ``__new__`` and given the fields their ``__init__`` would set from a
model, a server configuration and process groups; any other field is missing, as on an
object that never had it.

One channel is substituted: ``ForwardThread`` hands work over through a
``queue.SimpleQueue``, whose ``put`` -> ``get`` the recorder does not model (it orders nothing
there); the driver gives the forward thread a ``queue.Queue`` (the same FIFO) so the
hand-over is the ordering it is.
"""

from __future__ import annotations

import queue
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.tokenspeed import plans
from overlap_harness.engines.tokenspeed.environment import import_tokenspeed
from overlap_harness.engines.tokenspeed.stand_ins import front_end, kernels
from overlap_harness.engines.tokenspeed.stand_ins.forward import ForwardCut
from overlap_harness.recorder import watch

VOCAB = 64
POOL_SIZE = 8  # request-pool rows; row POOL_SIZE is the state-write padding row
MAX_BS = 4
MAX_TOKENS = 32


@dataclass
class Setup:
    """One variant: its script, and how the executor is configured."""

    name: str
    script: Callable[[], list[Any]]
    graphs: bool = False
    draft_width: int = 0
    in_flight_depth: int = 1
    notes: str = ""
    seeds: dict[str, int] = field(default_factory=dict)


def _fifo_queue_module() -> types.SimpleNamespace:
    """``queue`` as the forward thread sees it: ``SimpleQueue`` is ``queue.Queue``."""
    return types.SimpleNamespace(SimpleQueue=queue.Queue)


def _torch_with_host_generators() -> types.ModuleType:
    """``torch`` for the sampling backend's construction, except that ``Generator`` makes a
    host generator: the backend's one device generator (``_capture_gen``) serves only CUDA
    graph capture warm-ups, which the driven path never runs, and the recorder refuses device
    generators in CPU mode."""
    proxy = types.ModuleType("torch")
    proxy.__dict__.update(vars(torch))
    proxy.Generator = lambda device=None: torch.Generator()  # type: ignore[attr-defined]
    return proxy


def _sampling_backend(output_length: int) -> Any:
    from tokenspeed.runtime.sampling.backends import flashinfer
    from tokenspeed.runtime.sampling.backends.base import SamplingBackendConfig

    config = SamplingBackendConfig(
        enable_speculative_sampling=False, sampling_stream="default", logprob_order="sampled",
        max_bs=MAX_BS, max_draft_tokens_per_req=output_length, max_req_pool_size=POOL_SIZE,
        vocab_size=VOCAB, device=torch.device("cuda"), tp_group=None)
    with attributes_set([(flashinfer, "torch", _torch_with_host_generators())]):
        return flashinfer.FlashInferSamplingBackend(config)


def build_executor(setup: Setup) -> Any:
    """A ``ModelExecutor`` with the fields ``execute_forward_op`` reads, made as ``__init__``
    makes them (its streams, forward thread, runtime states, input buffers, NaN guard,
    multimodal runtime, sampling backend), the forward cut at ``forward_step``."""
    from tokenspeed.runtime.execution.forward_thread import ForwardThread
    from tokenspeed.runtime.execution.input_buffer import InputBuffers
    from tokenspeed.runtime.execution.model_executor import ModelExecutor
    from tokenspeed.runtime.execution.multimodal_runtime import MultimodalRuntime
    from tokenspeed.runtime.execution.nan_guard import NanGuard
    from tokenspeed.runtime.execution.runtime_states import RuntimeStates

    output_length = 1 + setup.draft_width
    executor = ModelExecutor.__new__(ModelExecutor)
    executor.device = "cuda"
    executor.device_module = torch.get_device_module("cuda")
    executor.default_stream = executor.device_module.default_stream()
    executor.execution_stream = executor.device_module.Stream()
    executor.forward_thread = ForwardThread("cuda")
    executor.runtime_states = RuntimeStates(POOL_SIZE, VOCAB, output_length, "cuda")
    executor.input_buffers = InputBuffers(MAX_BS, MAX_TOKENS, POOL_SIZE, "cuda")
    executor.nan_guard = NanGuard.create(False, MAX_BS, "cuda")
    executor.mm_runtime = MultimodalRuntime(model_is_mrope=False,
                                            input_buffers=executor.input_buffers,
                                            device="cuda")
    executor.sampling_backend = _sampling_backend(output_length)
    executor.config = StrictStub(
        "executor config", output_length=output_length,
        spec_num_tokens=output_length if setup.draft_width else None,
        spec_algo="EAGLE" if setup.draft_width else None, query_shard_size=1,
        data_parallel_size=1, pp_size=1, global_rank=0, grammar_backend=None,
        model_is_mrope=False)
    executor.dp_sampling_runtime_config = StrictStub("dp sampling runtime", enabled=False)
    executor._cache_runtime_contract = StrictStub(
        "cache runtime contract",
        group_specs=(StrictStub("cache group spec", group_id=front_end.GROUP_ID),),
        virtual_block_counts={front_end.GROUP_ID: front_end.VIRTUAL_BLOCKS})
    executor.attn_backend = StrictStub("attention backend",
                                       skips_incomplete_prefill_outputs=False)
    executor.token_to_kv_pool = front_end.KvPoolStandIn()
    executor.draft_token_to_kv_pool = None
    executor.drafter = (StrictStub("drafter", absent=("prepare_request_state",))
                        if setup.draft_width else None)
    executor.tree_spec = None
    executor.grammar_runtime = None
    executor.dspark_context_producer = None
    executor.log_step = 0
    executor._prev_decode_bs = 0
    executor.forward_step = ForwardCut(executor, VOCAB, graphs=setup.graphs,
                                       draft_width=setup.draft_width)
    return executor


def build_event_loop(device_handle: Any, scheduler: Any, processor: Any, depth: int,
                     shutdown: threading.Event) -> Any:
    """An ``EventLoop`` with the fields ``event_loop`` reads on a single-rank engine."""
    from tokenspeed.runtime.engine.event_loop import EventLoop

    loop = EventLoop.__new__(EventLoop)
    fields = {
        "in_flight_depth": depth, "shutdown_event": shutdown, "has_dp": False,
        "_ngram_context_len": 0, "_request_history_rows": None,
        "_uses_eager_grammar": False, "_device": device_handle, "scheduler": scheduler,
        "output_processor": processor,
        "server_args": StrictStub("server args", enable_log_request_stats=False,
                                  mapping=StrictStub("mapping", has_pp=False)),
        "model_config": StrictStub("model config", is_multimodal_active=False),
        **front_end.hooks()}
    for key, value in fields.items():
        setattr(loop, key, value)
    return loop


def _request_states(requests: list[plans.Request]) -> dict[str, Any]:
    from tokenspeed.runtime.sampling.sampling_params import SamplingParams

    return {r.rid: front_end.request_state(
        SamplingParams(temperature=1.0, top_k=4, top_p=1.0, seed=7 + r.slot), len(r.prompt))
        for r in requests}


def run(setup: Setup) -> Any:
    """Drive TokenSpeed's loop through ``setup``'s script; returns the finished watch, with
    ``outputs`` the committed (tokens, lengths) per commit."""
    import_tokenspeed()
    from tokenspeed.runtime.execution import forward_thread
    from tokenspeed.runtime.execution.device import DeviceHandle

    requests, rounds = setup.script()
    shutdown = threading.Event()
    with watch("cpu") as w, kernels.tokenspeed_kernels_declared(), attributes_set(
            [(forward_thread, "queue", _fifo_queue_module())]):
        executor = build_executor(setup)
        scheduler = front_end.ScriptedScheduler(rounds, shutdown)
        plan_of_round = scheduler.next_execution_plan

        def next_plan() -> Any:  # each round is an iteration of the recording
            w.iteration(scheduler.rounds)
            return plan_of_round()
        scheduler.next_execution_plan = next_plan
        processor = front_end.CommittingOutputProcessor(_request_states(requests))
        handle = DeviceHandle(executor)
        loop = build_event_loop(handle, scheduler, processor, setup.in_flight_depth, shutdown)
        try:
            loop.event_loop()
        finally:
            executor.forward_thread.shutdown()
    w.outputs = processor.committed
    return w
