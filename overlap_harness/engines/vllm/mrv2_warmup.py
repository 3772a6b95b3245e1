"""Model Runner V2's mixed prefill+decode warmup (``run_mixed_prefill_decode_warmup``,
vllm/v1/worker/gpu/warmup.py) as one release has it, over the UVA ring.

The warmup builds its own ``SchedulerOutput``s and runs them through the worker's
``execute_model`` and ``sample_tokens``, and discards the outputs: nothing takes
``get_output()``, so nothing waits for the device, and the ``UvaBufferPool`` ring (as deep as
the batch queue) comes back to a slot two writes later while an earlier step's write kernel
may still read it. Up to 0.33.0 the steps run back to back; 0.34.0 runs each through
``_run_step``, which ends with ``torch.accelerator.synchronize()`` ("Warmup discards the
outputs, so without this a slow GPU reads slots already overwritten", its docstring).

Driven: the release's whole file's functions (``run_mixed_prefill_decode_warmup`` and the
helpers it calls, ``_run_step`` included where the file has it), each compiled from the file
with its lines in a namespace of the loaded tree's ``warmup`` module plus the names the file
imports (from the loaded tree). The harness stands in for the runner (a strict stub of the
fields the warmup reads) and for the worker: :class:`~.engine_core.FakeWorker`, whose
``execute_model`` stages the block-table rows of the step's requests through vLLM's
``StagedWriteTensor`` (the declared write kernel reads the ring slot) and runs the fake
forward, and whose ``sample_tokens`` returns vLLM's ``AsyncOutput``. The warmup is called
twice in a row (two warmups back to back, as vLLM's kernel warmups call it one after the
other; what vLLM's callers run between two calls is not driven).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.core.mutation import function_from_file
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import VllmUnavailable, cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import watch

WARMUP_FILE = "vllm/v1/worker/gpu/warmup.py"
NUM_TOKENS, MAX_MODEL_LEN, NUM_BLOCKS, RING_DEPTH = 8, 64, 32, 2


def release_namespace(source_file: Path) -> dict[str, Any]:
    """The globals ``source_file``'s functions run in: the loaded tree's ``warmup`` module's,
    then what the file imports (each import statement run against the loaded tree), then
    every function the file defines at module level, compiled from the file.

    Raises:
        VllmUnavailable: the loaded tree lacks a module or name the file imports.
    """
    from vllm.v1.worker.gpu import warmup

    namespace = dict(vars(warmup))
    tree = ast.parse(Path(source_file).read_text(), filename=str(source_file))
    for statement in tree.body:
        if isinstance(statement, ast.Import | ast.ImportFrom):
            code = compile(ast.Module(body=[statement], type_ignores=[]), str(source_file),
                           "exec")
            try:
                exec(code, namespace)
            except ImportError as exc:
                raise VllmUnavailable(f"the loaded tree lacks what {source_file.name} "
                                      f"imports: {exc}") from exc
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef):
            namespace[statement.name] = function_from_file(source_file, None, statement.name,
                                                           namespace)
    return namespace


def warmup_runner() -> Any:
    """The fields of Model Runner V2's ``GPUModelRunner`` the warmup reads (0.32.0 to
    0.34.0), for one full-attention KV cache group of 4-token blocks, no speculative
    decoding, no extensible KV cache; anything else raises with its name."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from overlap_harness.engines.vllm.engine_core import BLOCK_SIZE, MAX_REQS

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    vllm_config = StrictStub("vllm_config", num_lookahead_tokens=0,
                             parallel_config=StrictStub("parallel_config",
                                                        decode_context_parallel_size=1))
    connector = StrictStub("kv_connector", set_disabled=lambda disabled: None)
    return StrictStub(
        "model_runner", absent=("extensible_kv_cache",),
        is_pooling_model=False, max_num_reqs=MAX_REQS, max_model_len=MAX_MODEL_LEN,
        max_num_tokens=NUM_TOKENS * 4, num_speculative_steps=0, speculative_config=None,
        vllm_config=vllm_config, model_state=StrictStub("model_state",
                                                        absent=("max_encoder_len",)),
        model_config=StrictStub("model_config", get_vocab_size=lambda: 16),
        kv_cache_config=StrictStub("kv_cache_config", num_blocks=NUM_BLOCKS,
                                   kv_cache_groups=[StrictStub("kv_cache_group",
                                                               kv_cache_spec=spec)]),
        kv_connector=connector)


def warmup_steps(source_file: Path, calls: int = 2) -> Any:
    """``source_file``'s ``run_mixed_prefill_decode_warmup`` called ``calls`` times in a row
    on the stand-in runner and worker (a ring of 2 slots, the default batch queue's depth);
    each call is an iteration of the watch. Returns the watch, with ``w.ran`` what each call
    returned (True: the warmup ran its steps)."""
    import_vllm()
    from vllm.v1.worker.gpu import buffer_utils

    from overlap_harness.engines.vllm.engine_core import FakeWorker

    namespace = release_namespace(Path(source_file))
    warmup = namespace["run_mixed_prefill_decode_warmup"]
    runner = warmup_runner()
    with watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils):
        worker = FakeWorker(torch.device("cuda"), RING_DEPTH)
        ran = []
        for call in range(calls):
            w.iteration(call)
            ran.append(warmup(runner, worker.execute_model, worker.sample_tokens,
                              NUM_TOKENS))
    w.ran = ran
    return w
