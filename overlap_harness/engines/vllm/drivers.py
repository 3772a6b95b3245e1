"""vLLM's own overlap code driven for several steps under the recorder (CPU mode).

Each driver runs the real vLLM classes and methods on the path and fakes only the model:
the forward and the sampler are a few torch ops on the current (default) stream that read
and write exactly the tensors the real kernels do (the logits, the sampled ids, the block
table rows the step uses). The engine's async scheduling is modelled as it runs: step N's
work is issued, then the output of step N-1 is taken (``get_output()``), so two steps are in
flight.

* :func:`v1_async_output` - the V1 runner's ``AsyncGPUModelRunnerOutput``: the D2H of sampled
  ids (and logprobs) on ``async_output_copy_stream`` after ``wait_stream``, the event, and
  ``get_output()``'s synchronize then ``tolist()``.
* :func:`v1_input_prep` - the V1 runner's ``synchronize_input_prep()`` around the host writes
  of the pinned staging buffers (``CpuGpuBuffer.np``) and their non-blocking H2D copies.
* :func:`mrv2_step` - Model Runner V2: ``StagedWriteTensor.apply_write`` (the ``UvaBufferPool``
  ring read by a kernel through UVA views), then ``AsyncOutput`` on the copy stream.

Every driver returns the :class:`~overlap_harness.recorder.api.Watch` it ran under.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import watch

NUM_REQS = 3
VOCAB = 16


@dataclass
class Variant:
    """A driven path and its parameters; ``run()`` returns the watch."""

    name: str
    driver: Any
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self) -> Any:
        return self.driver(**self.kwargs)


def _sample(logits: torch.Tensor) -> torch.Tensor:
    """The fake sampler: greedy ids, one per request, on the current stream."""
    return logits.argmax(dim=-1, keepdim=True).to(torch.int32)


def _logprobs(logits: torch.Tensor) -> Any:
    from vllm.v1.outputs import LogprobsTensors

    top = torch.log_softmax(logits, dim=-1).topk(2, dim=-1)
    ranks = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    return LogprobsTensors(top.indices.to(torch.int32), top.values, ranks)


def runner_output(req_ids: list[str]) -> Any:
    """vLLM's ``ModelRunnerOutput`` for the requests ``req_ids``, with their index map where
    the release's output has one (``req_id_to_index``: gone in 0.34.0)."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
    index = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
             if "req_id_to_index" in fields else {})
    return ModelRunnerOutput(req_ids=list(req_ids), **index)


def _runner_output(num_reqs: int) -> Any:
    return runner_output([f"req{i}" for i in range(num_reqs)])


def v1_async_output(steps: int = 4, logprobs: bool = True) -> Any:
    """The V1 runner's async output path, two steps in flight."""
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    with watch("cpu") as w, cuda_selected(w):
        async_output_copy_stream = torch.cuda.Stream()
        logits = torch.zeros(NUM_REQS, VOCAB, device="cuda")
        pending: list[Any] = []
        results = []
        for step in range(steps):
            w.iteration(step)
            logits.add_(float(step + 1))  # the forward: this step's logits
            sampled = _sample(logits)
            output = AsyncGPUModelRunnerOutput(
                _runner_output(NUM_REQS), sampled, _logprobs(logits) if logprobs else None,
                [], async_output_copy_stream, vocab_size=VOCAB)
            pending.append(output)
            if len(pending) == 2:  # the engine takes step N-1's output after issuing step N
                results.append(pending.pop(0).get_output())
        results.extend(p.get_output() for p in pending)
    w.outputs = results
    return w


def _bare_v1_runner(async_scheduling: bool) -> Any:
    """A ``GPUModelRunner`` made with ``__new__``: only the fields ``synchronize_input_prep``
    reads are set, as ``__init__`` sets them (the event exists only with async scheduling);
    any other field is missing, as on an object that never had it."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.prepare_inputs_event = (torch.cuda.Event(blocking=True) if async_scheduling
                                   else None)
    return runner


def v1_input_prep(steps: int = 4, async_scheduling: bool = True) -> Any:
    """``execute_model``'s host-side input preparation under ``synchronize_input_prep()``:
    the host writes the pinned staging rows (``CpuGpuBuffer.np``) and issues their
    non-blocking H2D copies; the forward reads the device rows. Nothing else orders the host
    against step N-1's copies, so the fence is what keeps step N's rewrite after them.
    ``async_scheduling=False`` with two steps in flight is the pipeline-parallel batch queue
    without async scheduling: ``__init__`` makes no event there, so the fence is empty."""
    import_vllm()
    from vllm.v1.utils import CpuGpuBuffer

    with watch("cpu") as w, cuda_selected(w):
        runner = _bare_v1_runner(async_scheduling)
        input_ids = CpuGpuBuffer(8, dtype=torch.int32, device=torch.device("cuda"))
        positions = CpuGpuBuffer(8, dtype=torch.int64, device=torch.device("cuda"))
        logits = torch.zeros(8, VOCAB, device="cuda")
        for step in range(steps):
            w.iteration(step)
            with runner.synchronize_input_prep():
                input_ids.np[:NUM_REQS] = [step * 10 + r for r in range(NUM_REQS)]
                positions.np[:NUM_REQS] = step
                input_ids.copy_to_gpu(NUM_REQS)
                positions.copy_to_gpu(NUM_REQS)
            rows = input_ids.gpu[:NUM_REQS].long() % 8  # the forward reads this step's inputs
            logits[rows] += positions.gpu[:NUM_REQS].unsqueeze(1).float()
    return w


def mrv2_step(steps: int = 4, ring_depth: int | None = None) -> Any:
    """Model Runner V2: each step stages block-table row writes, applies them with the
    write kernel reading the ``UvaBufferPool`` ring through UVA views, runs the forward,
    and copies the sampled ids out with ``AsyncOutput``; step N-1's output is taken after
    step N is issued. ``ring_depth`` is the pools' ``max_concurrency`` (vLLM's default: 2)."""
    import_vllm()
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    with watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils):
        device = torch.device("cuda")
        block_table = buffer_utils.StagedWriteTensor((NUM_REQS, 4), torch.int32, device,
                                                     max_concurrency=ring_depth)
        main_stream = torch.cuda.current_stream()
        copy_stream = torch.cuda.Stream()
        logits = torch.zeros(NUM_REQS, VOCAB, device=device)
        pending: list[Any] = []
        results = []
        for step in range(steps):
            w.iteration(step)
            for req in range(NUM_REQS):  # the scheduler's new blocks for this step
                block_table.stage_write(req, 0, [step * 4 + req, step])
            block_table.apply_write()
            logits.add_(block_table.gpu[:, :1].float())  # the forward reads the rows
            sampled = _sample(logits)
            num_sampled = torch.ones(NUM_REQS, dtype=torch.int32, device=device)
            sampler_output = SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None,
                                           num_nans=None, num_sampled=num_sampled,
                                           num_rejected=torch.zeros_like(num_sampled))
            pending.append(AsyncOutput(_runner_output(NUM_REQS), sampler_output, num_sampled,
                                       main_stream, copy_stream, check_ep_fault=False,
                                       pending_aux_output=None))
            if len(pending) == 2:
                results.append(pending.pop(0).get_output())
        results.extend(p.get_output() for p in pending)
    w.outputs = results
    return w


def _read_pooled(output: Any) -> list:
    """The engine's use of a pooling output: every finished request's vector read on the
    host (serialized for the client)."""
    return [None if t is None else t.tolist() for t in output.pooler_output]


def v1_pooling(steps: int = 4, hidden: int = 4) -> Any:
    """The V1 runner's pooling output: ``AsyncGPUPoolingModelRunnerOutput`` copies the
    pooled vectors of the finished requests on ``async_output_copy_stream``; step N-1's
    output is taken (and read) after step N is issued. Every other step one request is still
    prefilling (a partial ``finished_mask``)."""
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUPoolingModelRunnerOutput

    with watch("cpu") as w, cuda_selected(w):
        async_output_copy_stream = torch.cuda.Stream()
        hidden_states = torch.zeros(NUM_REQS, hidden, device="cuda")
        pending: list[Any] = []
        pooled = []
        for step in range(steps):
            w.iteration(step)
            hidden_states.add_(float(step + 1))  # the forward
            pooler_output = hidden_states * 2.0  # the pooler: a fresh tensor each step
            finished = [True] * NUM_REQS if step % 2 else [True, False, True]
            pending.append(AsyncGPUPoolingModelRunnerOutput(
                _runner_output(NUM_REQS), pooler_output, finished, async_output_copy_stream))
            if len(pending) == 2:
                pooled.append(_read_pooled(pending.pop(0).get_output()))
        pooled.extend(_read_pooled(p.get_output()) for p in pending)
    w.outputs = pooled
    return w


def mrv2_pooling(steps: int = 4, hidden: int = 4) -> Any:
    """Model Runner V2's ``AsyncPoolingOutput``: the pooled vectors copied on the copy
    stream, ``get_output()`` (which ``unbind``s the host tensor before its synchronize: views,
    no read), then the engine reads them."""
    import_vllm()
    from vllm.v1.worker.gpu.async_utils import AsyncPoolingOutput

    with watch("cpu") as w, cuda_selected(w):
        main_stream = torch.cuda.current_stream()
        copy_stream = torch.cuda.Stream()
        hidden_states = torch.zeros(NUM_REQS, hidden, device="cuda")
        pending: list[Any] = []
        pooled = []
        for step in range(steps):
            w.iteration(step)
            hidden_states.add_(float(step + 1))
            pooler_output = hidden_states * 2.0
            pending.append(AsyncPoolingOutput(_runner_output(NUM_REQS), pooler_output,
                                              [True] * NUM_REQS, main_stream, copy_stream))
            if len(pending) == 2:
                pooled.append(_read_pooled(pending.pop(0).get_output()))
        pooled.extend(_read_pooled(p.get_output()) for p in pending)
    w.outputs = pooled
    return w


def _spec_runner(num_spec_tokens: int) -> Any:
    """A bare ``GPUModelRunner`` with the spec-decode fields ``__init__`` sets under async
    scheduling (events, copy streams, pinned buffers) and a strict input batch."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = GPUModelRunner.__new__(GPUModelRunner)
    runner.use_async_scheduling, runner.use_async_spec_decode = True, False
    runner.num_spec_tokens = num_spec_tokens
    runner.draft_token_ids_event = torch.Event()
    runner.draft_token_ids_copy_stream = torch.cuda.Stream()
    runner.draft_token_ids_cpu = torch.empty((NUM_REQS, num_spec_tokens), dtype=torch.int64,
                                             pin_memory=True)
    runner.valid_sampled_token_count_event = torch.Event()
    runner.valid_sampled_token_count_copy_stream = torch.cuda.Stream()
    runner.valid_sampled_token_count_cpu = torch.empty(NUM_REQS, dtype=torch.int32,
                                                       pin_memory=True)
    runner._draft_token_ids, runner._draft_token_req_ids = None, None
    runner.input_batch = StrictStub(
        "input_batch", req_ids=[f"req{i}" for i in range(NUM_REQS)],
        prev_sampled_token_ids=None,
        sampling_metadata=StrictStub("sampling_metadata", output_token_ids=[]))
    return runner


def v1_spec_decode(steps: int = 4, num_spec_tokens: int = 2) -> Any:
    """EAGLE/MTP-style speculative decoding under async scheduling in the V1 runner: each
    step the target forward and rejection sampler (fakes) produce the accepted ids and the
    valid counts, ``_copy_valid_sampled_token_count`` copies the counts out on their stream,
    the drafter (fake) proposes the next draft ids, ``_copy_draft_token_ids_to_cpu`` copies
    them out (a request with structured output makes it needed), and the sampled ids leave
    through ``AsyncGPUModelRunnerOutput``. The next step starts with
    ``_get_valid_sampled_token_count()`` (as ``_prepare_inputs`` does) and the engine takes the
    drafts with ``take_draft_token_ids()``."""
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    width = 1 + num_spec_tokens
    with watch("cpu") as w, cuda_selected(w):
        runner = _spec_runner(num_spec_tokens)
        async_output_copy_stream = torch.cuda.Stream()
        logits = torch.zeros(NUM_REQS, width, VOCAB, device="cuda")
        scheduler_output = StrictStub("scheduler_output", has_structured_output_requests=True)
        pending: list[Any] = []
        counts, drafts = [], []
        for step in range(steps):
            w.iteration(step)
            counts.append(runner._get_valid_sampled_token_count())  # _prepare_inputs
            logits.add_(float(step + 1))  # the target forward over 1 + k positions
            sampled = logits.argmax(dim=-1).to(torch.int32)  # the rejection sampler
            valid = torch.full((NUM_REQS,), width, dtype=torch.int32, device="cuda")
            runner._copy_valid_sampled_token_count(sampled[:, -1], valid)
            runner._draft_token_ids = sampled[:, 1:].to(torch.int64) + 1  # the drafter
            runner._copy_draft_token_ids_to_cpu(scheduler_output)
            pending.append(AsyncGPUModelRunnerOutput(_runner_output(NUM_REQS), sampled, None,
                                                     [], async_output_copy_stream,
                                                     vocab_size=VOCAB))
            drafts.append(runner.take_draft_token_ids())  # the engine, before scheduling
            if len(pending) == 2:
                pending.pop(0).get_output()
        for output in pending:
            output.get_output()
    w.outputs = (counts, drafts)
    return w


VARIANTS = {
    "v1-async-output": Variant("v1-async-output", v1_async_output),
    "v1-input-prep": Variant("v1-input-prep", v1_input_prep),
    "mrv2-uva-ring": Variant("mrv2-uva-ring", mrv2_step),
    "v1-pooling": Variant("v1-pooling", v1_pooling),
    "mrv2-pooling": Variant("mrv2-pooling", mrv2_pooling),
    "v1-spec-decode": Variant("v1-spec-decode", v1_spec_decode),
}
