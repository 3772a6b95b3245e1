"""A pipeline-parallel batch queue with async scheduling, in one process, two fake stages.

With async scheduling and pipeline parallelism vLLM 0.32 runs Model Runner V2 (the V1 runner
"does not fully support" the pair): ``VllmConfig.max_concurrent_batches`` is then
``pipeline_parallel_size + 1`` (3 for two stages), ``EngineCore.step_with_batch_queue`` keeps
that many batches in flight, the runner sizes every ``UvaBufferPool`` ring to it
(``set_default_max_concurrency``), and the ``AsyncScheduler`` spaces a request's decodes
``pp_size`` steps apart. The last stage samples and broadcasts the sampled ids to the first
on a side stream; the first stage consumes step T's broadcast at step T + pp_size
(``PPHandler.receive`` / ``get_prev_sampled_outputs``: an event per step, ``wait_event`` on
the main stream, ``record_stream`` for the tensors the side stream made).

vLLM's own ``EngineCore``, ``AsyncScheduler``, ``UniProcExecutor``, ``PPHandler`` (one per
stage rank, each with a strict PP group), ``StagedWriteTensor`` and ``AsyncOutput`` run; the
forwards and the sampler are fakes, and so is ``torch.distributed.broadcast``: the last rank's
call reads its tensor on the current stream, the first rank's call writes its tensor, with the
values sent (matched in order, as NCCL matches a group's broadcasts). Both stage ranks share
CPU mode's one default stream (in a real run each has its own device); each rank's memory is
its own, so that adds no ordering between one rank's accesses.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError
from overlap_harness.engines.vllm.engine_core import (
    BLOCK_SIZE,
    MAX_REQS,
    VOCAB,
    async_scheduler,
    drive_engine,
    model_runner_v2_chosen,
)
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import declared, reads, watch, writes

PP_SIZE = 2
SAMPLED_ROWS = MAX_REQS + 1  # the last row takes the entries a consumed slot excludes (-1)


def _send_values(tensor: torch.Tensor, mailbox: deque) -> None:
    mailbox.append(tensor.clone())


def _receive_values(tensor: torch.Tensor, mailbox: deque) -> None:
    tensor.copy_(mailbox.popleft())


_send = declared(lambda _r, tensor, _mailbox: reads(tensor), cpu_impl=_send_values,
                 name="broadcast (send)")(_send_values)
_receive = declared(lambda _r, tensor, _mailbox: writes(tensor), cpu_impl=_receive_values,
                    name="broadcast (receive)")(_receive_values)


class FakeBroadcast:
    """``torch.distributed.broadcast(tensor, src, group)`` between the stage ranks: the group
    stub names the calling rank."""

    def __init__(self) -> None:
        self.mailbox: deque = deque()

    def __call__(self, tensor: torch.Tensor, src: int, group: Any) -> None:
        if group.rank == src:
            _send(tensor, self.mailbox)
        else:
            _receive(tensor, self.mailbox)


class Stage:
    """One stage rank: its own block table (``StagedWriteTensor`` over the UVA ring) and
    ``PPHandler``; the first stage also keeps the last sampled id per request row."""

    def __init__(self, rank: int, device: torch.device) -> None:
        from vllm.v1.worker.gpu import pp_utils
        from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor

        self.rank, self.device = rank, device
        self.is_last = rank == PP_SIZE - 1
        group = StrictStub(f"pp_group[rank {rank}]", is_last_rank=self.is_last,
                           is_first_rank=rank == 0, last_rank=PP_SIZE - 1,
                           world_size=PP_SIZE,
                           make_sibling_device_group=lambda group_desc: StrictStub(
                               f"{group_desc}[rank {rank}]", rank=rank))
        with attributes_set([(pp_utils, "get_pp_group", lambda: group)]):
            self.pp = pp_utils.PPHandler(MAX_REQS, 0, device)
        self.block_table = StagedWriteTensor((MAX_REQS, 16), torch.int32, device)
        self.last_sampled = torch.zeros(SAMPLED_ROWS, 1, dtype=torch.int64, device=device)

    def consume_previous(self) -> None:
        """The first stage's ``update_pp_decode_requests``: step T - pp_size's samples
        into the request rows (excluded entries, -1, land in the spare row)."""
        outputs = self.pp.get_prev_sampled_outputs()
        if outputs is not None:
            rows = outputs["idx_mapping"]
            rows = torch.where(rows >= 0, rows, SAMPLED_ROWS - 1)
            self.last_sampled[rows] = outputs["sampled_tokens"][:, :1]


class PipelineWorker:
    """The executor's worker: every step runs stage 0 then stage 1 (the intermediate
    tensors handed on), the last stage samples and broadcasts, the first receives."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stages = [Stage(rank, device) for rank in range(PP_SIZE)]
        self.rows: dict[str, int] = {}
        self.prompt_len: dict[str, int] = {}
        self.copy_stream = torch.cuda.Stream()
        self.step: dict[str, Any] = {}

    def _input_batch(self, scheduler_output: Any) -> Any:
        """This step's batch as ``PPHandler`` reads it (vLLM's MRV2 ``InputBatch`` fields)."""
        from vllm.utils.torch_utils import async_tensor_h2d

        computed = {new.req_id: new.num_computed_tokens
                    for new in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        req_ids = list(scheduler_output.num_scheduled_tokens)
        rows = np.array([self.rows[r] for r in req_ids], dtype=np.int64)
        return StrictStub(
            "input_batch", req_ids=req_ids, num_reqs=len(req_ids), idx_mapping_np=rows,
            idx_mapping=async_tensor_h2d(rows, device=self.device),
            num_computed_tokens_np=np.array([computed[r] for r in req_ids]),
            prefill_len_np=np.array([self.prompt_len[r] for r in req_ids]),
            num_scheduled_tokens=np.array([scheduler_output.num_scheduled_tokens[r]
                                           for r in req_ids]),
            max_seq_len_np=None, num_draft_tokens=0)

    def execute_model(self, scheduler_output: Any) -> Any:
        for req_id in scheduler_output.finished_req_ids:
            if req_id in self.rows:
                self.stages[0].pp.on_req_idx_freed(self.rows.pop(req_id))
        for new in scheduler_output.scheduled_new_reqs:
            self.rows[new.req_id] = min(set(range(MAX_REQS)) - set(self.rows.values()))
            self.prompt_len[new.req_id] = len(new.prompt_token_ids)
        self.stages[0].consume_previous()
        if not scheduler_output.num_scheduled_tokens:
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            return EMPTY_MODEL_RUNNER_OUTPUT
        for stage in self.stages:
            _stage_block_writes(stage, scheduler_output, self.rows)
        batch = self._input_batch(scheduler_output)
        first, last = self.stages
        hidden = (first.block_table.gpu[batch.idx_mapping, :1].float()
                  + first.last_sampled[batch.idx_mapping].float())  # stage 0's layers
        logits = hidden + last.block_table.gpu[batch.idx_mapping, :1].float()  # stage 1's
        self.step = {"batch": batch, "logits": logits.repeat(1, VOCAB) % 5}
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.worker.gpu.async_utils import AsyncOutput
        from vllm.v1.worker.gpu.sample.output import SamplerOutput

        from overlap_harness.engines.vllm.drivers import runner_output

        batch, logits = self.step["batch"], self.step["logits"]
        first, last = self.stages
        sampled = logits.argmax(dim=-1, keepdim=True)  # int64, as broadcast asserts
        from vllm.utils.torch_utils import async_tensor_h2d

        sampling = (batch.num_computed_tokens_np + batch.num_scheduled_tokens
                    >= batch.prefill_len_np)  # a non-final prefill chunk samples nothing
        count = async_tensor_h2d(sampling.astype(np.int32), device=self.device)
        rejected = torch.zeros_like(count)
        last.pp.broadcast(sampled, count, rejected, batch)  # the last rank
        first.pp.receive(batch, **_no_drafts(first.pp))  # the first rank
        sampler_output = SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None,
                                       num_nans=None, num_sampled=count, num_rejected=rejected)
        output = runner_output(batch.req_ids)
        return AsyncOutput(output, sampler_output, count, torch.cuda.current_stream(),
                           self.copy_stream, check_ep_fault=False, pending_aux_output=None)


def _no_drafts(handler: Any) -> dict[str, bool]:
    """``receive``'s drafts switch where the release has one (``recv_drafts``, 0.33.0 on:
    it must match whether the last rank broadcasts drafts; no spec decode here)."""
    import inspect

    return ({"recv_drafts": False}
            if "recv_drafts" in inspect.signature(handler.receive).parameters else {})


def _stage_block_writes(stage: Stage, scheduler_output: Any, rows: dict[str, int]) -> None:
    """A stage's block-table rows for this step, staged and applied (the UVA ring)."""
    for new in scheduler_output.scheduled_new_reqs:
        stage.block_table.stage_write(rows[new.req_id], 0, new.block_ids[0])
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                            cached.num_computed_tokens, strict=True):
        if new_blocks is not None and new_blocks[0]:
            stage.block_table.stage_write(rows[req_id], computed // BLOCK_SIZE, new_blocks[0])
    stage.block_table.apply_write()


def pp_batch_queue_steps(num_requests: int = 3, max_tokens: int = 4,
                         ring_depth: int | None = None, max_calls: int = 60,
                         prompts: list[list[int]] | None = None,
                         token_budget: int = 64) -> Any:
    """Requests through the two-stage pipeline until done, with Model Runner V2 chosen
    (``VLLM_USE_V2_MODEL_RUNNER=1``, as on a CUDA build with Triton) so vLLM's config gives
    the batch queue its depth. ``ring_depth``: the UVA rings' depth (default: vLLM's,
    ``max_concurrent_batches``); ``prompts`` (default: ``num_requests`` of 3-5 tokens) and
    ``token_budget`` (``max_num_batched_tokens``: a longer prompt is prefilled in chunks).
    Returns the watch with ``w.finished`` and ``w.queue`` (the batch queue's depth)."""
    import_vllm()
    from vllm.v1.worker.gpu import buffer_utils

    scheduler, config = async_scheduler(PP_SIZE + 1, max_num_batched_tokens=token_budget,
                                        pipeline_parallel_size=PP_SIZE, model_runner_v2=True)
    with model_runner_v2_chosen():
        queue = config.max_concurrent_batches
    depth = queue if ring_depth is None else ring_depth
    broadcast = FakeBroadcast()
    with (watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils),
          attributes_set([(buffer_utils, "_DEFAULT_MAX_CONCURRENCY", depth),
                          (torch.distributed, "broadcast", broadcast)])):
        worker = PipelineWorker(torch.device("cuda"))
        if prompts is None:
            prompts = [[1, 2, 3, 4, 5][: 3 + index] for index in range(num_requests)]
        w.finished = drive_engine(w, scheduler, config, worker, prompts, max_tokens, queue,
                                  max_calls)
    w.queue = queue
    if broadcast.mailbox:
        raise UnplannedUseError(f"{len(broadcast.mailbox)} broadcasts sent that no rank "
                                "received")
    return w
