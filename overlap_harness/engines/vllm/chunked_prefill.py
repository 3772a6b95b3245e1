"""Chunked prefill through vLLM's engine core on the V1 runner's async path.

``EngineCore.step_with_batch_queue`` with the real ``AsyncScheduler`` (chunked prefill on, a
token budget of 8 a step) schedules a 14-token prompt in chunks beside two requests that are
already decoding; two batches are in flight. The worker's steps are the V1 runner's own
pieces: the host-side input preparation under ``GPUModelRunner.synchronize_input_prep()``
(the pinned ``CpuGpuBuffer`` staging of the input ids, positions, the logits indices and the
previous step's sampled-id rows, copied with ``copy_to_gpu``), and the sampled ids out through
``AsyncGPUModelRunnerOutput`` (the partially prefilled request's sample discarded through its
``invalid_req_indices``, as the runner does). The forward and the sampler are fakes.

Under async scheduling the host does not know a decoding request's input token (step N-1
has not been read back when step N is prepared): as the V1 runner does, the input row is
filled on the device from step N-1's sampled ids, at rows the host staged.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.vllm.engine_core import (
    MAX_REQS,
    VOCAB,
    async_scheduler,
    drive_engine,
)
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.recorder import watch

TOKEN_BUDGET = 8  # max_num_batched_tokens: the long prompt needs two chunks and a bit
LONG_PROMPT = list(range(1, 15))
STAGING = 16  # rows of each pinned staging buffer (>= the token budget)


class V1Worker:
    """The worker the executor calls: ``execute_model`` prepares the inputs under the
    input-prep fence and runs the fake forward; ``sample_tokens`` samples the last scheduled
    token of each request and returns ``AsyncGPUModelRunnerOutput``."""

    def __init__(self, device: torch.device) -> None:
        from vllm.v1.utils import CpuGpuBuffer

        from overlap_harness.engines.vllm.drivers import _bare_v1_runner

        self.runner = _bare_v1_runner(async_scheduling=True)
        buffer = dict(device=device)
        self.input_ids = CpuGpuBuffer(STAGING, dtype=torch.int64, **buffer)
        self.positions = CpuGpuBuffer(STAGING, dtype=torch.int64, **buffer)
        self.logits_indices = CpuGpuBuffer(MAX_REQS, dtype=torch.int64, **buffer)
        self.decode_positions = CpuGpuBuffer(MAX_REQS, dtype=torch.int64, **buffer)
        self.prev_rows = CpuGpuBuffer(MAX_REQS, dtype=torch.int64, **buffer)
        self.embedding = torch.arange(64 * VOCAB, dtype=torch.float32,
                                      device=device).reshape(64, VOCAB) % 7
        self.copy_stream = torch.cuda.Stream()
        self.prompts: dict[str, list[int]] = {}
        self.prev_sampled: torch.Tensor | None = None  # step N-1's sampled ids [n, 1]
        self.prev_index: dict[str, int] = {}  # their rows, by request
        self.batch: list[str] = []
        self.partial: list[int] = []  # batch rows still prefilling: no sample kept
        self.hidden: torch.Tensor | None = None

    def _plan(self, scheduler_output: Any) -> tuple[list[int], list[int], list[int],
                                                    list[tuple[int, int]]]:
        """Host side of the step: each scheduled token's id (0 where the device fills it
        in) and position, each request's last token row, and (row, previous row) per
        decoding request."""
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            self.prompts[new.req_id] = list(new.prompt_token_ids)
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        token_ids: list[int] = []
        positions: list[int] = []
        last_rows: list[int] = []
        decodes: list[tuple[int, int]] = []
        self.batch, self.partial = list(scheduler_output.num_scheduled_tokens), []
        for index, req_id in enumerate(self.batch):
            count, start = scheduler_output.num_scheduled_tokens[req_id], computed[req_id]
            prompt = self.prompts[req_id]
            prompt_len = len(prompt)
            for position in range(start, start + count):
                if position < prompt_len:
                    token_ids.append(prompt[position])
                else:  # a decode: step N-1 sampled it; the device fills it in
                    decodes.append((len(token_ids), self.prev_index[req_id]))
                    token_ids.append(0)
                positions.append(position)
            last_rows.append(len(token_ids) - 1)
            if start + count < prompt_len:
                self.partial.append(index)
        return token_ids, positions, last_rows, decodes

    def execute_model(self, scheduler_output: Any) -> Any:
        if not scheduler_output.num_scheduled_tokens:
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            return EMPTY_MODEL_RUNNER_OUTPUT
        token_ids, positions, last_rows, decodes = self._plan(scheduler_output)
        total = len(token_ids)
        with self.runner.synchronize_input_prep():
            self.input_ids.np[:total] = token_ids
            self.positions.np[:total] = positions
            self.logits_indices.np[:len(last_rows)] = last_rows
            self.input_ids.copy_to_gpu(total)
            self.positions.copy_to_gpu(total)
            self.logits_indices.copy_to_gpu(len(last_rows))
            if decodes:
                self.decode_positions.np[:len(decodes)] = [row for row, _ in decodes]
                self.prev_rows.np[:len(decodes)] = [prev for _, prev in decodes]
                self.decode_positions.copy_to_gpu(len(decodes))
                self.prev_rows.copy_to_gpu(len(decodes))
        input_ids = self.input_ids.gpu[:total]
        if decodes:  # the previous step's samples, gathered on the device
            assert self.prev_sampled is not None
            rows = self.prev_rows.gpu[:len(decodes)]
            input_ids[self.decode_positions.gpu[:len(decodes)]] = (
                self.prev_sampled[rows, 0].to(torch.int64))
        hidden = self.embedding[input_ids % 64] + self.positions.gpu[:total].unsqueeze(1)
        self.hidden = hidden[self.logits_indices.gpu[:len(last_rows)]]  # the forward
        return None

    def sample_tokens(self, grammar_output: Any) -> Any:
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

        sampled = self.hidden.argmax(dim=-1, keepdim=True).to(torch.int32)
        self.prev_sampled = sampled
        self.prev_index = {req_id: row for row, req_id in enumerate(self.batch)}
        output = ModelRunnerOutput(req_ids=list(self.batch),
                                   req_id_to_index=dict(self.prev_index))
        return AsyncGPUModelRunnerOutput(output, sampled, None, list(self.partial),
                                         self.copy_stream, vocab_size=VOCAB)


def chunked_prefill_steps(max_tokens: int = 4, max_calls: int = 40) -> Any:
    """Two short requests, then the long one, to the end. Returns the watch, with
    ``w.finished`` the finished ids and ``w.chunks`` the long request's scheduled token
    counts, in order (its prefill chunks, then its decodes)."""
    import_vllm()
    scheduler, config = async_scheduler(2, max_num_batched_tokens=TOKEN_BUDGET)
    chunks: list[int] = []
    original = scheduler.schedule

    def schedule(*args: Any, **kwargs: Any) -> Any:
        output = original(*args, **kwargs)
        if output.num_scheduled_tokens.get("req2"):
            chunks.append(output.num_scheduled_tokens["req2"])
        return output

    scheduler.schedule = schedule  # observes: the scheduler's own answer is returned
    with watch("cpu") as w, cuda_selected(w):
        worker = V1Worker(torch.device("cuda"))
        w.finished = drive_engine(w, scheduler, config, worker, [[1, 2, 3], [4, 5, 6, 7],
                                                                 LONG_PROMPT],
                                  max_tokens, 2, max_calls)
    w.chunks = chunks
    return w
