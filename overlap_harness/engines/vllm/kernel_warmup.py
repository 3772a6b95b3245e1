"""Model Runner V2's kernel warmup (``_warmup_kernels``, vllm/v1/worker/gpu/warmup.py) as the
loaded tree has it, over vLLM's own block tables.

``warmup_kernels`` (the worker calls it once at start-up, before the CUDA graphs are captured)
runs ``_warmup_kernels``: a prefill step of every warmup request, then 3 decode steps (5 with
speculative decoding), then a cleanup step, each through the worker's ``execute_model`` and
``sample_tokens``, the outputs discarded; it waits for the device only at its end
(``torch.accelerator.synchronize()``). Its sibling ``run_mixed_prefill_decode_warmup`` got a
wait after every step in 0.34.0 (``_run_step``: "Warmup discards the outputs, so without this
a slow GPU reads slots already overwritten"); ``_warmup_kernels`` did not (0.32.0 to 0.34.0).

What makes the steps meet: every ``execute_model`` of Model Runner V2 applies the block
tables' staged writes (``BlockTables.apply_staged_writes``), which ends with
``num_blocks.copy_to_uva()``: a host write of the per-request block counts into the next slot
of a ``UvaBufferPool`` ring (as deep as the batch queue, 2 by default), and every step with
tokens gathers the batch's rows with ``_gather_block_tables_kernel``, which reads that slot on
the device. In serving, the engine takes step N's output (a host wait) before step N+2
rewrites N's slot; in the warmup nothing does.

Driven: the loaded tree's ``_warmup_kernels`` (or the same function compiled from an edited
copy of its file, :func:`with_step_waits`), called once on a stand-in runner (a strict stub of
the fields the warmup reads: one full-attention KV cache group of 4-token blocks, no
speculative decoding, no pooling, no encoder) and a stand-in worker
(:class:`BlockTableWorker`): ``execute_model`` does the block-table part of Model Runner V2's
``execute_model`` with vLLM's own ``BlockTables`` (``append_block_ids`` for new requests and
new blocks, ``apply_staged_writes``, ``gather_block_tables``), then the fake forward;
``sample_tokens`` returns vLLM's ``AsyncOutput`` (:class:`~.engine_core.FakeWorker`'s). The
harness declares the gather kernel (:func:`gather_kernel_declared`) and the staged-write
kernel, and stands in for the rest of the runner's step (request states, input buffers,
attention metadata, the model, the sampler).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.core.mutation import function_from_file
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.engine_core import BLOCK_SIZE, MAX_REQS, FakeWorker
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import declared, reads, watch, writes
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names the vLLM line that launched the kernel, not this file

WARMUP_FILE = "vllm/v1/worker/gpu/warmup.py"
NUM_BLOCKS, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_NUM_TOKENS = 32, 64, 4, 32
MAX_BLOCKS_PER_REQ = MAX_MODEL_LEN // BLOCK_SIZE
#: the statements of ``_warmup_kernels`` that end a step with tokens (its prefill's and each
#: decode step's sampling): :func:`with_step_waits` adds the host wait after each
STEP_ENDS = ("worker_sample_tokens(grammar_output)", "worker_sample_tokens(None)")


def _gather_rows(idx_mapping: torch.Tensor, source: torch.Tensor, target: torch.Tensor,
                 num_blocks: torch.Tensor, num_reqs: int, num_rows: int) -> None:
    """The kernel's values for one KV cache group: row ``b`` of ``target`` is the first
    ``num_blocks[idx_mapping[b]]`` entries of ``source``'s row ``idx_mapping[b]``; rows from
    ``num_reqs`` to ``num_rows`` are zeroed (padding)."""
    for batch_row in range(num_reqs):
        request_row = int(idx_mapping[batch_row])
        count = int(num_blocks[request_row])
        target[batch_row, :count] = source[request_row, :count]
    target[num_reqs:num_rows] = 0


def _gather_accesses(_result: Any, idx_mapping: torch.Tensor, source: torch.Tensor,
                     target: torch.Tensor, num_blocks: torch.Tensor, num_reqs: int,
                     num_rows: int) -> list:
    return (reads(idx_mapping[:num_reqs]) + reads(num_blocks)
            + reads(source, rows=idx_mapping[:num_reqs]) + writes(target[:num_rows]))


_declared_gather = declared(_gather_accesses, cpu_impl=_gather_rows,
                            name="_gather_block_tables_kernel")(_gather_rows)


class _GatherLaunch:
    """``_gather_block_tables_kernel[grid](...)`` for the one ``BlockTables`` it was made for:
    the row-pointer arrays it is passed must be that object's (anything else raises), and the
    sliding-window masking (0.34.0) is not declared."""

    def __init__(self, tables: Any) -> None:
        self.tables = tables

    def __getitem__(self, grid: tuple[int, int]) -> Any:
        tables = self.tables

        def launch(idx_mapping: torch.Tensor, source_ptrs: torch.Tensor,
                   target_ptrs: torch.Tensor, _strides: Any, num_blocks: torch.Tensor,
                   _num_blocks_stride: Any, num_reqs: int, *_masking: Any,
                   BLOCK_SIZE: int, MASK_SLIDING_WINDOW: bool = False) -> None:
            if MASK_SLIDING_WINDOW:
                raise NotImplementedError("_gather_block_tables_kernel: the sliding-window "
                                          "masking is not declared (not driven)")
            if (source_ptrs is not tables.block_table_ptrs
                    or target_ptrs is not tables.input_block_table_ptrs):
                raise NotImplementedError("_gather_block_tables_kernel: only the block "
                                          "tables' own row pointers are declared")
            for group, table in enumerate(tables.block_tables):
                _declared_gather(idx_mapping, table.gpu, tables.input_block_tables[group],
                                 num_blocks[group], num_reqs, grid[1])
        return launch


@contextmanager
def gather_kernel_declared(block_table_module: Any, tables: Any) -> Iterator[None]:
    """Inside: ``block_table_module._gather_block_tables_kernel`` is the declared stand-in,
    for ``tables``."""
    original = block_table_module._gather_block_tables_kernel
    block_table_module._gather_block_tables_kernel = _GatherLaunch(tables)
    try:
        yield
    finally:
        block_table_module._gather_block_tables_kernel = original


class BlockTableWorker(FakeWorker):
    """The worker ``_warmup_kernels`` calls. ``execute_model`` does what Model Runner V2's
    ``execute_model`` does with the block tables, on vLLM's own ``BlockTables``: finished
    requests give their rows back, new requests take a row and their blocks
    (``append_block_ids(..., overwrite=True)``), scheduled requests append their new blocks,
    then ``apply_staged_writes()`` (every step, as the runner calls it before its
    nothing-scheduled return), then, for a step with tokens, ``gather_block_tables`` over the
    batch's rows and the fake forward reading the gathered table. ``sample_tokens`` is
    :class:`~.engine_core.FakeWorker`'s (vLLM's ``AsyncOutput``)."""

    def __init__(self, device: torch.device) -> None:
        from vllm.v1.worker.gpu.block_table import BlockTables

        super().__init__(device, ring_depth=None)
        self.tables = BlockTables([BLOCK_SIZE], MAX_REQS, MAX_NUM_TOKENS,
                                  [MAX_BLOCKS_PER_REQ], device)
        self.request_rows = torch.arange(MAX_REQS, dtype=torch.int32, device=device)

    def execute_model(self, scheduler_output: Any) -> Any:
        for req_id in scheduler_output.finished_req_ids:
            self.rows.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.rows[new.req_id] = min(set(range(MAX_REQS)) - set(self.rows.values()))
            self.tables.append_block_ids(self.rows[new.req_id], new.block_ids, overwrite=True)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_blocks in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if new_blocks is not None:
                self.tables.append_block_ids(self.rows[req_id], new_blocks, overwrite=False)
        self.tables.apply_staged_writes()
        self.batch = list(scheduler_output.num_scheduled_tokens)
        if not self.batch:  # nothing scheduled: the runner answers with the empty output
            from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

            return EMPTY_MODEL_RUNNER_OUTPUT
        first, last = self._row_span()
        # the batch's rows as one slice of a device arange (the runner's idx_mapping is an
        # H2D copy; a device index built here from a host list would be a blocking copy)
        (table,) = self.tables.gather_block_tables(self.request_rows[first:last], last - first)
        self.logits[first:last].add_(table[:, :1].float())  # the forward reads the table
        return None


def kernel_warmup_runner() -> Any:
    """The fields of Model Runner V2's ``GPUModelRunner`` that ``_warmup_kernels`` reads
    (0.32.0 to 0.34.0): one full-attention KV cache group of 4-token blocks, no speculative
    decoding, no pooling, no encoder, no extensible KV cache, no KV-block zeroer; anything
    else raises with its name."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                             dtype=torch.float32)
    vllm_config = StrictStub("vllm_config", is_mm_encoder_only=False, num_lookahead_tokens=0,
                             parallel_config=StrictStub("parallel_config",
                                                        decode_context_parallel_size=1))
    scheduler_config = StrictStub("scheduler_config", max_num_seqs=MAX_NUM_SEQS,
                                  max_num_batched_tokens=MAX_NUM_TOKENS)
    return StrictStub(
        "model_runner", absent=("extensible_kv_cache", "block_tables"),
        vllm_config=vllm_config, scheduler_config=scheduler_config,
        num_speculative_steps=0, decode_query_len=1, speculative_config=None,
        speculator=None, is_pooling_model=False, is_encoder_decoder=False,
        is_last_pp_rank=True, kv_block_zeroer=None, max_num_reqs=MAX_REQS,
        max_model_len=MAX_MODEL_LEN, max_num_tokens=MAX_NUM_TOKENS,
        model_state=StrictStub("model_state", absent=("max_encoder_len",)),
        model_config=StrictStub("model_config", get_vocab_size=lambda: 16),
        kv_cache_config=StrictStub("kv_cache_config", num_blocks=NUM_BLOCKS,
                                   kv_cache_groups=[StrictStub("kv_cache_group",
                                                               kv_cache_spec=spec)]),
        kv_connector=StrictStub("kv_connector", set_disabled=lambda disabled: None))


def with_step_waits(source_file: Path, dest: Path) -> Path:
    """A copy of ``source_file`` (a release's warmup.py) at ``dest`` whose ``_warmup_kernels``
    waits for the device after each step with tokens: ``; torch.accelerator.synchronize()``
    appended to each :data:`STEP_ENDS` line of the function (what ``_run_step`` gives the
    mixed warmup in 0.34.0), so every line keeps its number. The harness's proposed fix, not
    vLLM's code.

    Raises:
        ValueError: the file's ``_warmup_kernels`` has no such line (another shape).
    """
    lines = Path(source_file).read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("def _warmup_kernels("))
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith(("def ", "@", "class "))), len(lines))
    edited = 0
    for index in range(start, end):
        if lines[index].strip() in STEP_ENDS:
            lines[index] = lines[index].rstrip("\n") + "; torch.accelerator.synchronize()\n"
            edited += 1
    if not edited:
        raise ValueError(f"{source_file}: _warmup_kernels has none of {STEP_ENDS}")
    dest.write_text("".join(lines))
    return dest


def kernel_warmup_steps(source_file: Path | None = None) -> Any:
    """``_warmup_kernels`` called once on the stand-in runner and worker; each call of the
    worker's ``execute_model`` starts an iteration of the watch. ``source_file``: compile the
    function from that file (its lines) in the loaded tree's ``warmup`` module's globals;
    None: the loaded tree's own. Returns the watch, with ``w.steps`` the number of
    ``execute_model`` calls."""
    import_vllm()
    from vllm.v1.worker.gpu import block_table, buffer_utils, warmup

    function = (warmup._warmup_kernels if source_file is None else
                function_from_file(Path(source_file), None, "_warmup_kernels", vars(warmup)))
    runner = kernel_warmup_runner()
    with watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils):
        worker = BlockTableWorker(torch.device("cuda"))
        steps = 0

        def execute_model(scheduler_output: Any) -> Any:
            nonlocal steps
            w.iteration(steps)
            steps += 1
            return worker.execute_model(scheduler_output)

        with gather_kernel_declared(block_table, worker.tables):
            function(runner, execute_model, worker.sample_tokens)
    w.steps = steps
    return w
