"""Model Runner V2's CUDA graphs: vLLM's ``CudaGraphManager`` captures a FULL decode graph of
the forward and replays it each step, between MRV2's staged writes and its async output copy.

vLLM's own code runs: ``CudaGraphManager.__init__`` (its descriptors from the compilation
config), ``capture`` (the warm-up run, then the capture under ``torch.cuda.graph`` on the
stream vLLM's ``graph_capture`` makes, in the pool ``capture_pool`` names), ``dispatch``
(which graph a batch takes) and ``run_fullgraph`` (the replay), and ``graph_capture`` with
each parallel group's ``GroupCoordinator.graph_capture`` (single-rank groups: no
communicator, so its stream switch and its wait on the current stream are all it does).
The recorder fakes the graph API (CPU mode: ``recorder/graph_api.py``), the captured template
re-issued at each replay on the replaying stream. The harness stands in for the forward that
is captured (torch ops reading the static inputs: the token ids and the block table MRV2's
staged writes fill, writing the static hidden states), the sampler, and the parallel groups'
identities (strict stubs).

Each step: the block-table rows are staged and applied through the UVA ring, the previous
step's sampled ids are copied into the static input ids, the batch is dispatched and the graph
replayed (or run eagerly when no graph takes it), the sampled ids go out through
``AsyncOutput``; step N-1's output is taken after step N is issued.
"""

from __future__ import annotations

import functools
from contextlib import ExitStack
from typing import Any

import torch

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import watch

NUM_REQS, MAX_REQS, BLOCKS, VOCAB, HIDDEN = 3, 4, 4, 16, 8


def _single_rank_group(name: str) -> Any:
    """A parallel group of one rank whose ``graph_capture`` is vLLM's
    ``GroupCoordinator.graph_capture`` (no device communicator: nothing to capture but the
    stream)."""
    from vllm.distributed.parallel_state import GroupCoordinator

    me = StrictStub(name, device_communicator=None, is_first_rank=True, is_last_rank=True,
                    world_size=1)
    return StrictStub(name, graph_capture=functools.partial(GroupCoordinator.graph_capture, me),
                      is_first_rank=True, is_last_rank=True, world_size=1)


def _graph_config() -> Any:
    """A ``VllmConfig`` (the engine core's small scheduler) asking for FULL decode graphs of
    1, 2 and 4 requests."""
    from vllm.config.compilation import CUDAGraphMode

    from overlap_harness.engines.vllm.engine_core import MODEL_CONFIG_FIELDS, async_scheduler

    _scheduler, config = async_scheduler(2)
    object.__setattr__(config, "model_config", StrictStub(  # what capture_pool asks too
        "model_config", **MODEL_CONFIG_FIELDS, enable_sleep_mode=False,
        sleep_mode_offload_cudagraph=False))
    compilation = config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    compilation.max_cudagraph_capture_size = MAX_REQS  # the CPU platform set none
    # the sizes to capture, under the release's name for them: per request count of decode
    # graphs and no prefill graphs (0.34.0), or one list of token counts (earlier)
    for name, sizes in (("decode_cudagraph_capture_request_sizes", [1, 2, MAX_REQS]),
                        ("prefill_cudagraph_capture_token_sizes", []),
                        ("cudagraph_capture_sizes", [1, 2, MAX_REQS])):
        if hasattr(compilation, name):
            setattr(compilation, name, sizes)
    return config


def _decode_queries(cudagraph_utils: Any) -> dict[str, Any]:
    """One-token decodes, as the release's ``CudaGraphManager`` takes them: a map from query
    length to the most requests (0.34.0: ``decode_query_lens``) or the one query length
    (``decode_query_len``, earlier)."""
    import inspect

    parameters = inspect.signature(cudagraph_utils.CudaGraphManager).parameters
    if "decode_query_lens" in parameters:
        return {"decode_query_lens": {1: MAX_REQS}}
    return {"decode_query_len": 1}


class _StaticForward:
    """The captured forward: reads the static input ids and block-table rows, writes the
    static hidden states (what a graph replays in place)."""

    def __init__(self, device: torch.device, block_table: torch.Tensor) -> None:
        self.input_ids = torch.zeros(MAX_REQS, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(MAX_REQS, HIDDEN, device=device)
        self.embedding = torch.arange(64 * HIDDEN, dtype=torch.float32,
                                      device=device).reshape(64, HIDDEN) % 5
        self.block_table = block_table

    def create(self, desc: Any, warmup: bool) -> Any:
        """``create_forward_fn``: the forward of ``desc.num_reqs`` requests."""
        rows = desc.num_reqs

        def forward(cg_mode: Any) -> None:
            tokens = torch.index_select(self.embedding, 0, self.input_ids[:rows])
            blocks = torch.index_select(self.embedding, 0, self.block_table[:rows, 0])
            self.hidden[:rows] = tokens + blocks
        return forward


def cuda_graph_steps(steps: int = 5, capture: bool = True) -> Any:
    """Decode steps of ``NUM_REQS`` requests replaying vLLM's captured FULL graph
    (``capture=False``: none captured, so every step runs eagerly: the values to compare).
    Returns the watch with ``w.outputs`` the sampled ids and ``w.modes`` each step's graph
    mode."""
    import_vllm()
    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu import buffer_utils, cudagraph_utils
    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    from overlap_harness.engines.vllm.drivers import runner_output

    config = _graph_config()
    groups = {name: _single_rank_group(name) for name in ("tp", "pp", "dp")}
    with ExitStack() as stack:
        w = stack.enter_context(watch("cpu"))
        stack.enter_context(cuda_selected(w))
        stack.enter_context(apply_write_kernel_declared(buffer_utils))
        stack.enter_context(torch.inference_mode())  # as execute_model and capture run
        stack.enter_context(attributes_set([
            (parallel_state, "get_tp_group", lambda: groups["tp"]),
            (parallel_state, "get_pp_group", lambda: groups["pp"]),
            (parallel_state, "get_dp_group", lambda: groups["dp"]),
            (cudagraph_utils, "get_pp_group", lambda: groups["pp"]),
            (cudagraph_utils, "is_global_first_rank", lambda: False),
            # vLLM's cached current stream follows torch.cuda.set_stream through its own
            # patch of it, which the recorder's fake streams replace: ask them instead
            (cudagraph_utils, "current_stream", torch.cuda.current_stream)]))
        device = torch.device("cuda")
        block_table = buffer_utils.StagedWriteTensor((MAX_REQS, BLOCKS), torch.int32, device)
        forward = _StaticForward(device, block_table.gpu)
        manager = cudagraph_utils.CudaGraphManager(config, device,
                                                   CUDAGraphMode.FULL_DECODE_ONLY,
                                                   **_decode_queries(cudagraph_utils))
        if capture:
            manager.capture(forward.create)
        main_stream, copy_stream = torch.cuda.current_stream(), torch.cuda.Stream()
        last_sampled = torch.ones(MAX_REQS, dtype=torch.int64, device=device)
        req_ids = [f"req{i}" for i in range(NUM_REQS)]
        pending: list[Any] = []
        outputs, modes = [], []
        for step in range(steps):
            w.iteration(step)
            for req in range(NUM_REQS):  # this step's new block of each request
                block_table.stage_write(req, step % BLOCKS, [step * NUM_REQS + req])
            block_table.apply_write()
            forward.input_ids[:NUM_REQS] = last_sampled[:NUM_REQS]  # the prepared input ids
            desc = manager.dispatch(NUM_REQS, NUM_REQS, uniform_token_count=1,
                                    num_active_loras=0)
            modes.append(desc.cg_mode.name)
            if desc.cg_mode == CUDAGraphMode.FULL:
                manager.run_fullgraph(desc)
            else:
                forward.create(desc, warmup=False)(desc.cg_mode)
            logits = forward.hidden[:NUM_REQS].sum(dim=1, keepdim=True) + torch.arange(
                VOCAB, device=device)  # the sampler's logits, from the static output
            sampled = (logits % 7).argmax(dim=-1, keepdim=True)
            last_sampled[:NUM_REQS] = sampled[:, 0]
            count = torch.ones(NUM_REQS, dtype=torch.int32, device=device)
            pending.append(AsyncOutput(
                runner_output(req_ids),
                SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None, num_nans=None,
                              num_sampled=count, num_rejected=torch.zeros_like(count)),
                count, main_stream, copy_stream, check_ep_fault=False,
                pending_aux_output=None))
            if len(pending) == 2:
                outputs.append(pending.pop(0).get_output().sampled_token_ids)
        outputs.extend(p.get_output().sampled_token_ids for p in pending)
    w.outputs, w.modes = outputs, modes
    return w
