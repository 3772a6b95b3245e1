"""The installed V1 runner's input preparation with spec decode on a hybrid (GDN) model.

Variant ``v1-hybrid-spec-decode``: two requests decode with 2 draft tokens each (an MTP-style
drafter) on a model with one GDN KV group, two steps in flight as under async scheduling.
Each step runs, inside ``synchronize_input_prep()`` as ``execute_model`` has them, the
installed ``GPUModelRunner._prepare_inputs`` (block table committed, positions, query starts,
the spec-decode metadata, and the previous step's accepted-token counts read on the host from
the pinned ``input_batch.num_accepted_tokens_cpu``) and ``_build_attention_metadata`` (vLLM's
``CommonAttentionMetadata``, the accepted counts handed to a ``GDNAttentionMetadataBuilder``);
after the forward and the fake rejection sampler, ``_update_states_after_model_execute``
copies the new counts back to the pinned tensor non-blocking and records
``num_accepted_tokens_event``.

0.32.0 reads the counts in ``_prepare_inputs`` (after ``num_accepted_tokens_event``'s
synchronize) only when not (async scheduling and ``mamba_cache_mode != "align"``): the
variant runs ``mamba_cache_mode="align"`` with async scheduling, where the copy is issued by
``mamba_utils.postprocess_mamba_align_gpu`` (the installed function, its fused Triton kernel
stood in for by the same update in torch ops). :func:`hybrid_spec_decode_steps` also runs the
other configurations (``mamba_cache_mode="none"``, or no async scheduling) for the tests.

What the harness stands in for: the runner's fields (as ``__init__`` makes them for this
configuration), ``_update_states`` (the requests stay; their counters advance), the
scheduler's output, the GDN builder's ``build`` (reads the counts on the device), the fused
postprocess kernel, the forward, the rejection sampler and the loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.recorder import watch

NUM_REQS, NUM_SPEC_TOKENS, MAX_REQS, MAX_TOKENS, PROMPT_LEN = 2, 2, 4, 32, 4


def _buffer(*size: int, dtype: torch.dtype) -> Any:
    from vllm.v1.utils import CpuGpuBuffer

    return CpuGpuBuffer(*size, dtype=dtype, device=torch.device("cuda"))


def _align_postprocess(runner: Any) -> None:
    """``mamba_cache_mode="align"``'s buffers: the fused postprocess context, already bound,
    whose kernel (a stand-in) keeps each request's accepted count (no state copy within one
    block here)."""
    device = torch.device("cuda")
    out = torch.ones(MAX_REQS, dtype=torch.int32, device=device)

    def run_fused_postprocess(*, num_reqs: int, num_accepted_tokens_gpu: torch.Tensor,
                              **staged: torch.Tensor) -> None:
        out[:num_reqs] = num_accepted_tokens_gpu[:num_reqs]

    staged = {name: _buffer(MAX_REQS, dtype=torch.int32) for name in (
        "mamba_state_idx_buf", "num_scheduled_tokens_buf", "num_computed_tokens_buf",
        "num_draft_tokens_buf")}
    context = StrictStub("postprocess_align", is_initialized=True, num_accepted_tokens_out=out,
                         run_fused_postprocess=run_fused_postprocess, **staged)
    runner._mamba_bufs = StrictStub("mamba_bufs", postprocess_align=context)
    runner._mamba_state_copy_funcs = StrictStub("mamba_state_copy_funcs")
    runner.compilation_config = StrictStub("compilation_config", static_forward_context={})


def _runner(async_scheduling: bool, mamba_cache_mode: str) -> Any:
    """A ``GPUModelRunner`` made with ``__new__`` with the fields the three functions read,
    as ``__init__`` makes them for a hybrid model with ``NUM_SPEC_TOKENS`` drafts."""
    from vllm.v1.kv_cache_interface import MambaSpec
    from vllm.v1.worker.block_table import SlotMappingMode
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from overlap_harness.engines.vllm.accepted_tokens import gdn_builder
    from overlap_harness.engines.vllm.drivers import _bare_v1_runner

    device = torch.device("cuda")
    runner = _bare_v1_runner(async_scheduling)
    assert isinstance(runner, GPUModelRunner)
    runner.device, runner.max_num_reqs, runner.max_model_len = device, MAX_REQS, MAX_TOKENS
    runner.use_async_scheduling = async_scheduling
    runner.use_async_spec_decode = async_scheduling  # and num_spec_tokens > 0
    runner.num_accepted_tokens_event = torch.Event()
    runner.speculative_config = StrictStub("speculative_config")
    runner.drafter = StrictStub("drafter")  # an MTP drafter: no EagleProposer
    runner.model_config = StrictStub("model_config", is_hybrid=True, rswa_window=None)
    runner.cache_config = StrictStub("cache_config", mamba_cache_mode=mamba_cache_mode,
                                     kv_sharing_fast_prefill=False, use_replayssm=False)
    runner.uses_mrope = runner.enable_prompt_embeds = runner.is_mm_prefix_lm = False
    runner.lora_config, runner._pp_recv_work, runner.valid_sampled_token_count_gpu = (
        None, None, None)
    runner.dcp_world_size = 1
    runner.arange_np = np.arange(MAX_TOKENS + 1, dtype=np.int64)
    runner._arange_scratch = np.zeros(MAX_TOKENS + 1, dtype=np.int64)
    for name, size, dtype in (("query_pos", MAX_TOKENS, torch.int64),
                              ("input_ids", MAX_TOKENS, torch.int32),
                              ("query_start_loc", MAX_REQS + 1, torch.int32),
                              ("discard_request_mask", MAX_REQS, torch.bool),
                              ("prev_positions", MAX_REQS, torch.int64),
                              ("num_accepted_tokens", MAX_REQS, torch.int64),
                              ("req_indices", MAX_TOKENS, torch.int64),
                              ("num_scheduled_tokens", MAX_REQS, torch.int32),
                              ("num_decode_draft_tokens", MAX_REQS, torch.int32)):
        setattr(runner, name, _buffer(size, dtype=dtype))
    runner.optimistic_seq_lens_cpu = torch.zeros(MAX_REQS, dtype=torch.int32)
    runner.num_computed_tokens = torch.zeros(MAX_REQS, dtype=torch.int32, device=device)
    runner.positions = torch.zeros(MAX_TOKENS, dtype=torch.int64, device=device)
    runner.seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32, device=device)
    runner.input_batch = InputBatch(
        max_num_reqs=MAX_REQS, max_model_len=MAX_TOKENS, max_num_batched_tokens=MAX_TOKENS,
        device=device, vocab_size=16, block_sizes=[4], max_num_blocks_per_req=[8],
        num_spec_tokens=NUM_SPEC_TOKENS, slot_mapping_modes=[SlotMappingMode.NONE])
    spec = MambaSpec(block_size=4, shapes=((1,),), dtypes=(torch.float32,),
                     mamba_type="gdn_attention")
    runner.kv_cache_config = StrictStub("kv_cache_config", kv_cache_groups=[
        StrictStub("kv_cache_group0", kv_cache_spec=spec)])
    builder = gdn_builder(_runner_module())
    runner.attn_groups = [[StrictStub(
        "attn_group", layer_names=["layer0"], get_metadata_builder=lambda ubid: builder,
        build_metadata=lambda metadata, ubid, **counts: builder.build(
            common_prefix_len=0, common_attn_metadata=metadata, **counts))]]
    if mamba_cache_mode == "align":
        _align_postprocess(runner)
    return runner


def _runner_module() -> Any:
    from vllm.v1.worker import gpu_model_runner

    return gpu_model_runner


def _add_requests(runner: Any) -> None:
    """Two requests, prompts of ``PROMPT_LEN`` tokens already prefilled (as after step 0 of
    a real run), each with its blocks."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    runner.requests = {}
    for index in range(NUM_REQS):
        request = CachedRequestState(
            f"req{index}", list(range(1, PROMPT_LEN + 1)), [], SamplingParams(), None,
            ([index * 4, index * 4 + 1, index * 4 + 2],), PROMPT_LEN, [PROMPT_LEN + index])
        runner.requests[request.req_id] = request
        runner.input_batch.add_request(request)


def hybrid_spec_decode_steps(steps: int = 4, async_scheduling: bool = True,
                             mamba_cache_mode: str = "align") -> Any:
    """Decode steps of two requests verifying ``NUM_SPEC_TOKENS`` drafts each, through the
    installed runner's ``_prepare_inputs``, ``_build_attention_metadata`` and
    ``_update_states_after_model_execute`` (see the module's docstring); the sampled ids go
    out through ``AsyncGPUModelRunnerOutput``, step N-1's output taken after step N is issued
    (with ``async_scheduling=False``, taken at once). Returns the watch."""
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _runner_output, _sample

    width = 1 + NUM_SPEC_TOKENS
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = _runner(async_scheduling, mamba_cache_mode)
        _add_requests(runner)
        batch = runner.input_batch
        copy_stream = torch.cuda.Stream()
        weights = torch.arange(16, dtype=torch.float32, device=device)
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            req_ids = list(batch.req_ids)
            drafts = {req_id: [step % 16, (step + 1) % 16] for req_id in req_ids}
            scheduler_output = StrictStub(
                "scheduler_output", total_num_scheduled_tokens=NUM_REQS * width,
                num_scheduled_tokens=dict.fromkeys(req_ids, width),
                scheduled_spec_decode_tokens=drafts)
            with runner.synchronize_input_prep():
                for index, req_id in enumerate(req_ids):  # _update_states
                    if step:  # optimistic: every draft of the last step accepted
                        batch.num_computed_tokens_cpu[index] += width
                    computed = int(batch.num_computed_tokens_cpu[index])
                    batch.token_ids_cpu[index, computed + 1:computed + width] = drafts[req_id]
                logits_indices, _, max_sampled = runner._prepare_inputs(
                    scheduler_output, np.full(NUM_REQS, width, dtype=np.int32))
                attn_metadata, _ = runner._build_attention_metadata(
                    NUM_REQS * width, NUM_REQS, width, logits_indices=logits_indices,
                    max_num_sampled_tokens=max_sampled, use_spec_decode=True,
                    num_scheduled_tokens=scheduler_output.num_scheduled_tokens,
                    slot_mappings={0: None})
            hidden = attn_metadata["layer0"].unsqueeze(-1) + step  # the forward
            logits = (hidden.unsqueeze(1) * weights + torch.arange(width, device=device)
                      .view(1, width, 1)) % 7  # one row per verified position
            sampled = logits.argmax(dim=-1)  # the rejection sampler
            accepted = 1 + (sampled[:, 0] % width)
            positions = torch.arange(width, device=device)
            output_token_ids = torch.where(positions < accepted.unsqueeze(1), sampled, -1)
            runner._update_states_after_model_execute(output_token_ids, scheduler_output)
            pending.append(AsyncGPUModelRunnerOutput(
                _runner_output(NUM_REQS), _sample(logits[:, 0]), None, [], copy_stream,
                vocab_size=16))
            if len(pending) == 2 or not async_scheduling:
                pending.pop(0).get_output()
            batch.prev_req_id_to_index = dict(batch.req_id_to_index)  # _bookkeeping_sync
        for output in pending:
            output.get_output()
    return w


def without_async_scheduling() -> Any:
    """Variant ``v1-hybrid-spec-decode-sync``: the same steps without async scheduling
    (``mamba_cache_mode="none"``): ``_prepare_inputs`` synchronizes the event and reads the
    counts, but each step's output is taken (its host sync) before the next is prepared."""
    return hybrid_spec_decode_steps(async_scheduling=False, mamba_cache_mode="none")


def async_without_align() -> Any:
    """Variant ``v1-hybrid-spec-decode-async-none``: async scheduling with
    ``mamba_cache_mode="none"``: ``_prepare_inputs`` neither synchronizes the event nor reads
    the counts (it fills 1s; the device corrects them)."""
    return hybrid_spec_decode_steps(async_scheduling=True, mamba_cache_mode="none")
