"""Which of ``execute_model``'s input-preparation phases a vLLM release puts inside its
input-prep fence, and what the host's rewrites of vLLM's reused pinned buffers race when a
phase is left outside.

The V1 runner reuses pinned CPU tensors between steps and copies them to the device with
non-blocking H2D copies; under async scheduling (or a pipeline-parallel batch queue) step
N+1's host code can rewrite a buffer before step N's copy of it has run. The fence is
``prepare_inputs_event``: synchronized before the host rewrites, recorded after the copies
are issued (inline in 0.10.2, ``synchronize_input_prep()`` since 0.11.0). Which phases it
covers changed from release to release, and each change was a published fix:
:func:`fenced_phases` reads it from a release's own ``execute_model`` (AST: the phases called
inside ``with self.synchronize_input_prep()``, or between the inline ``synchronize()`` and
``record()``). The phases' host writes and copies are vLLM's own code (the installed
``InputBatch`` and ``BlockTable``): ``_update_states`` adds and removes requests
(``add_request`` writes the sampling tensors and block-table rows through their NumPy views)
and refreshes the sampling metadata (``copy_slice`` H2D); ``_prepare_inputs`` commits the
block table (``copy_to_gpu``).
"""

from __future__ import annotations

import ast
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.recorder import watch

PHASES = ("update_states", "prepare_inputs", "preprocess")  # execute_model's order


def fenced_phases(runner_file: str | Path) -> dict[str, bool]:
    """``{phase: inside the fence}`` for the phases ``GPUModelRunner.execute_model`` of
    ``runner_file`` calls (``self._update_states(...)`` and so on)."""
    tree = ast.parse(Path(runner_file).read_text(), str(runner_file))
    runner = next(n for n in tree.body if isinstance(n, ast.ClassDef)
                  and n.name == "GPUModelRunner")
    execute = next(n for n in runner.body if isinstance(n, ast.FunctionDef)
                   and n.name == "execute_model")
    blocks, syncs, records, calls = [], [], [], {}
    for node in ast.walk(execute):
        if isinstance(node, ast.With) and any("synchronize_input_prep" in ast.unparse(
                item.context_expr) for item in node.items):
            blocks.append((node.lineno, node.end_lineno or node.lineno))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = ast.unparse(node.func)
            if target == "self.prepare_inputs_event.synchronize":
                syncs.append(node.lineno)
            elif target == "self.prepare_inputs_event.record":
                records.append(node.lineno)
            elif target.startswith("self._") and target[6:] in PHASES:
                calls[target[6:]] = node.lineno
    return {phase: any(a <= line <= b for a, b in blocks)
            or (any(s < line for s in syncs) and any(line < r for r in records))
            for phase, line in calls.items()}


def _request(step: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    params = SamplingParams(temperature=0.5 + 0.25 * (step % 4), top_p=0.9)
    return CachedRequestState(f"req{step}", [1, 2, 3], [], params, None, ([step],), 0, [])


def input_batch_steps(runner_file: str | Path | None, steps: int = 4,
                      event: bool = True) -> Any:
    """Steps of ``_update_states`` (a request finishes, a new one is added, the sampling
    metadata refreshed: vLLM's ``InputBatch``) and ``_prepare_inputs`` (the block table
    committed), fenced as ``runner_file``'s ``execute_model`` fences them (None: the
    installed runner's); the fake forward reads the device copies; the sampled ids go out
    through ``AsyncGPUModelRunnerOutput``, step N-1's output taken after step N is issued.
    ``event=False``: no ``prepare_inputs_event`` (the installed ``__init__`` makes none
    without async scheduling, as with a pipeline-parallel batch queue). Returns the watch."""
    info = import_vllm()
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _bare_v1_runner, _runner_output, _sample

    source = runner_file or Path(info.location) / "v1" / "worker" / "gpu_model_runner.py"
    inside = fenced_phases(source)
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = _bare_v1_runner(async_scheduling=event)
        batch = InputBatch(max_num_reqs=4, max_model_len=32, max_num_batched_tokens=64,
                           device=device, vocab_size=16, block_sizes=[4],
                           max_num_blocks_per_req=[8])
        copy_stream = torch.cuda.Stream()
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            fence = runner.synchronize_input_prep() if any(inside.values()) else nullcontext()
            phases = {"update_states": lambda s=step: _update_states(batch, s),
                      "prepare_inputs": lambda: batch.block_table.commit_block_table(1)}
            outside_first = [p for p in phases if not inside.get(p)]
            for phase in outside_first:  # before the fence: the fixes moved them in
                phases[phase]()
            with fence:
                for phase in phases:
                    if inside.get(phase):
                        phases[phase]()
            metadata = batch.sampling_metadata  # the forward reads this step's copies
            blocks = batch.block_table[0].get_device_tensor(1)
            logits = (metadata.temperature.unsqueeze(1) * blocks[:, :1].float()).repeat(1, 16)
            pending.append(AsyncGPUModelRunnerOutput(_runner_output(1), _sample(logits), None,
                                                     [], copy_stream, vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
        for output in pending:
            output.get_output()
    return w


def _update_states(batch: Any, step: int) -> None:
    if step:
        batch.remove_request(f"req{step - 1}")
        batch.condense()
    batch.add_request(_request(step))
    batch.refresh_metadata()


BLOCK_TABLE_FILE = "vllm/v1/worker/block_table.py"
_BLOCK_TABLE_METHODS = ("__init__", "append_row", "add_row", "compute_slot_mapping",
                        "commit_block_table", "commit_slot_mapping")


def _release_block_table(block_table_file: Path, device: torch.device) -> Any:
    """One ``BlockTable`` built by ``block_table_file``'s own class (a release before the
    table moved on the device): its methods compiled from that file, with that file's lines,
    in the installed module's globals; a PP/DCP group it asks for is absent, as in vLLM's
    own tests."""
    from vllm.v1.worker import block_table as installed

    from overlap_harness.engines.core.mutation import function_from_file

    namespace = dict(vars(installed))
    methods = {name: function_from_file(block_table_file, "BlockTable", name, namespace)
               for name in _BLOCK_TABLE_METHODS}
    table_class = type("BlockTableAt", (), methods)
    return table_class(block_size=4, max_num_reqs=4, max_num_blocks_per_req=8,
                       max_num_batched_tokens=32, pin_memory=True, device=device)


def slot_mapping_steps(runner_file: str | Path, block_table_file: str | Path,
                       steps: int = 4) -> Any:
    """``_prepare_inputs``' slot mapping as a release before 0.11 computed it on the host:
    ``BlockTable.compute_slot_mapping`` writes the pinned ``slot_mapping_np`` and
    ``commit_slot_mapping`` copies it to the device non-blocking (both from
    ``block_table_file``, the release's own), fenced as ``runner_file``'s ``execute_model``
    fences ``_prepare_inputs``. Two requests with their blocks from the start (so
    ``_update_states`` rewrites nothing after step 0: only ``_prepare_inputs`` is judged),
    a prefill then decodes; the fake forward reads the KV slots; the samples go out through
    ``AsyncGPUModelRunnerOutput``, step N-1's output taken after step N is issued."""
    import numpy as np

    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _bare_v1_runner, _runner_output, _sample

    fenced = fenced_phases(runner_file).get("prepare_inputs", False)
    prompt_lens = [4, 3]
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = _bare_v1_runner(async_scheduling=True)
        table = _release_block_table(Path(block_table_file), device)
        for row, blocks in enumerate(([0, 1, 2], [4, 5, 6])):
            table.add_row(blocks, row)
        kv_cache = torch.ones(32, 2, device=device)
        copy_stream = torch.cuda.Stream()
        computed = [0, 0]
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            scheduled = prompt_lens if step == 0 else [1, 1]
            req_indices = np.repeat(np.arange(2), scheduled)
            positions = np.concatenate([np.arange(c, c + n) for c, n in
                                        zip(computed, scheduled, strict=True)])
            with runner.synchronize_input_prep() if fenced else nullcontext():
                table.compute_slot_mapping(req_indices, positions)
                table.commit_block_table(2)
                table.commit_slot_mapping(len(positions))
            slots = table.slot_mapping[:len(positions)]  # the forward reads its KV slots
            kv_cache[slots] += float(step)
            logits = kv_cache[slots].sum(dim=0, keepdim=True).repeat(1, 8)
            pending.append(AsyncGPUModelRunnerOutput(_runner_output(1), _sample(logits), None,
                                                     [], copy_stream, vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
            computed = [c + n for c, n in zip(computed, scheduled, strict=True)]
        for output in pending:
            output.get_output()
    return w


def _recompute_pruned_positions(input_ids: list[int], multimodal_embeddings: list,
                                mrope_positions: torch.Tensor,
                                num_computed_tokens: int) -> tuple[list, torch.Tensor, int]:
    """The model's ``recompute_mrope_positions`` under multimodal pruning (the harness's
    fake): the embeddings kept, every position moved by one, a new delta, in every call and
    with no host sync. vLLM's own (``video_prune/evs.py``, through ``qwen3_vl.py``) returns
    the positions unchanged once every media token was seen, and reads device tensors on the
    host (``.item()``, a tensor in ``if``) on the way to changed ones."""
    return multimodal_embeddings, mrope_positions + 1, 1


def mrope_pruning_steps(pruning: bool = True, steps: int = 3,
                        recompute: Any = _recompute_pruned_positions) -> Any:
    """The installed runner's M-RoPE positions of a multimodal request (an image at prompt
    positions 1-2 of 4, then decodes), two steps in flight, everything under the input-prep
    fence as the installed ``execute_model`` has it: ``_prepare_inputs`` computes the positions
    into the pinned ``mrope_positions`` (``_calc_mrope_positions``) and issues one
    non-blocking H2D per row (inline in ``_prepare_inputs``, so the driver issues them the same
    way), then ``_preprocess`` gathers the image embeddings (``_gather_mm_embeddings``); with
    ``pruning`` (multimodal pruning with M-RoPE) the gather recomputes the positions into the
    same pinned buffer and copies them again; ``recompute`` is the model's
    ``recompute_mrope_positions`` (default: the fake that moves every position, unsynced).
    Returns the watch."""
    import numpy as np

    import_vllm()
    from vllm.multimodal.inputs import PlaceholderRange
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput, GPUModelRunner

    from overlap_harness.engines.core.strict import StrictStub
    from overlap_harness.engines.vllm.drivers import _runner_output, _sample

    prompt_len, hidden = 4, 8
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = GPUModelRunner.__new__(GPUModelRunner)
        runner.prepare_inputs_event = torch.cuda.Event(blocking=True)
        runner.is_multimodal_pruning_enabled, runner.uses_mrope = pruning, True
        runner.mrope_positions = CpuGpuBuffer(3, 17, dtype=torch.int64, device=device)
        runner.model = StrictStub("model", recompute_mrope_positions=recompute)
        image = StrictStub("mm_feature", mm_position=PlaceholderRange(offset=1, length=2),
                           identifier="image0", modality="image")
        request = StrictStub("request", num_computed_tokens=0, mm_features=[image],
                             prompt_token_ids=list(range(1, prompt_len + 1)), prompt_embeds=None,
                             mrope_positions=torch.arange(prompt_len).repeat(3, 1),
                             mrope_position_delta=0)
        runner.requests = {"req0": request}
        runner.input_batch = StrictStub("input_batch", req_ids=["req0"],
                                        num_computed_tokens_cpu=np.zeros(1, dtype=np.int64))
        runner.encoder_cache = {"image0": torch.ones(2, hidden, device=device)}
        copy_stream = torch.cuda.Stream()
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            scheduled = prompt_len if step == 0 else 1
            runner.input_batch.num_computed_tokens_cpu[0] = request.num_computed_tokens
            scheduler_output = StrictStub("scheduler_output",
                                          total_num_scheduled_tokens=scheduled,
                                          num_scheduled_tokens={"req0": scheduled})
            positions = runner.mrope_positions
            with runner.synchronize_input_prep():
                runner._calc_mrope_positions(scheduler_output)  # _prepare_inputs
                for row in range(positions.gpu.shape[0]):
                    positions.gpu[row, :scheduled].copy_(positions.cpu[row, :scheduled],
                                                         non_blocking=True)
                runner._gather_mm_embeddings(scheduler_output)  # _preprocess
            logits = positions.gpu[:, :scheduled].float().sum(dim=1, keepdim=True).T
            pending.append(AsyncGPUModelRunnerOutput(
                _runner_output(1), _sample(logits.repeat(1, 6)[:, :16]), None, [],
                copy_stream, vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
            request.num_computed_tokens += scheduled
        for output in pending:
            output.get_output()
    return w
