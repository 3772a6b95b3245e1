"""Model Runner V2's speculative decoding under async scheduling, as vLLM 0.32 has it.

Each step follows ``GPUModelRunner.execute_model``/``sample_tokens`` of
``vllm/v1/worker/gpu/model_runner.py``: the draft budget is chosen on the host from the stale
draft confidences (``AdaptiveVerificationManager.get_num_tokens``), the target forward
verifies the last sampled token and the ``k`` draft tokens, the rejection sampler (a fake)
gives the accepted ids with ``num_sampled``/``num_rejected``, ``AsyncOutput`` copies them out
on the output copy stream, the request state is updated on the device (the postprocess),
the drafter (a fake) proposes the next drafts into the request state, their confidences go
to the host through the adaptive verification's two pinned slots
(``record_confidences``: an event per slot), and ``DraftTokensHandler.set_draft_tokens``
copies the drafts out for the scheduler's grammar check (a request has structured output).
Step N-1's output is taken after step N is issued (two in flight); with structured output
the engine defers step N's sampling until then, and takes step N-1's drafts
(``get_draft_tokens()``) after step N's forward. vLLM's own classes run; nothing of them is
replaced.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.recorder import watch

NUM_REQS, MAX_REQS, VOCAB = 3, 4, 16
MAX_TOKENS = 64  # max_num_batched_tokens


def _adaptive_verification(num_spec_tokens: int, device: torch.device) -> Any:
    """vLLM's ``AdaptiveVerificationManager`` over a strict request state, with cost tables
    from vLLM's ``build_cost_tables_from_curves`` (what its startup profiling would give:
    two made-up timing curves)."""
    from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
        AdaptiveVerificationManager,
        build_cost_tables_from_curves,
    )

    req_states = StrictStub(
        "req_states", num_speculative_steps=num_spec_tokens, device=device,
        max_num_reqs=MAX_REQS, max_num_batched_tokens=MAX_TOKENS,
        req_id_to_index={f"req{i}": i for i in range(NUM_REQS)},
        num_computed_tokens_np=np.full(MAX_REQS, 8, dtype=np.int32),
        prefill_len=StrictStub("prefill_len", np=np.full(MAX_REQS, 4, dtype=np.int32)))
    query_start_loc = torch.zeros(MAX_REQS + 1, dtype=torch.int32, device=device)
    manager = AdaptiveVerificationManager(req_states, query_start_loc, num_bonus_tokens=1,
                                          max_total_logits=MAX_TOKENS)
    manager.cost_tables = build_cost_tables_from_curves(
        [(1, 0.5), (MAX_REQS, 1.0)], [(1, 1.0), (MAX_TOKENS, 4.0)], MAX_REQS, MAX_TOKENS)
    return manager


def mrv2_spec_decode(steps: int = 4, num_spec_tokens: int = 2) -> Any:
    """The steps above; returns the watch with ``w.outputs`` = (the sampled ids each
    ``get_output()`` gave, the draft ids the engine took, each step's token count)."""
    import_vllm()
    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.spec_decode.utils import DraftTokensHandler

    from overlap_harness.engines.vllm.drivers import _runner_output

    width = 1 + num_spec_tokens
    req_ids = [f"req{i}" for i in range(NUM_REQS)]
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        main_stream = torch.cuda.current_stream()
        output_copy_stream = torch.cuda.Stream()
        drafts_out = DraftTokensHandler(device)
        adaptive = _adaptive_verification(num_spec_tokens, device)
        draft_tokens = torch.zeros(MAX_REQS, num_spec_tokens, dtype=torch.int64,
                                   device=device)  # req_states.draft_tokens
        last_sampled = torch.ones(MAX_REQS, 1, dtype=torch.int64, device=device)
        idx_mapping = torch.arange(NUM_REQS, device=device)
        weights = torch.arange(VOCAB, dtype=torch.float32, device=device) % 5
        input_batch = StrictStub("input_batch", req_ids=req_ids, num_reqs=NUM_REQS,
                                 idx_mapping=idx_mapping, has_structured_output_reqs=True)
        pending: list[Any] = []
        sampled_out, drafts, token_counts = [], [], []
        for step in range(steps):
            w.iteration(step)
            token_counts.append(adaptive.get_num_tokens(  # execute_model: the budget
                {r: width for r in req_ids}, {r: [0] * num_spec_tokens for r in req_ids}))
            verify = torch.cat([last_sampled[idx_mapping], draft_tokens[idx_mapping]], dim=1)
            logits = (verify.unsqueeze(-1).float() + weights + step) % 7  # target forward
            if step:  # the engine's deferred structured-output sampling takes the drafts
                drafts.append(drafts_out.get_draft_tokens())
            sampled = logits.argmax(dim=-1)  # the rejection sampler: accepted, then bonus
            num_rejected = (sampled[:, 0] % width).to(torch.int32)
            num_sampled = width - num_rejected
            sampler_output = SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None,
                                           num_nans=None, num_sampled=num_sampled,
                                           num_rejected=num_rejected)
            pending.append(AsyncOutput(_runner_output(NUM_REQS), sampler_output, num_sampled,
                                       main_stream, output_copy_stream,
                                       check_ep_fault=False, pending_aux_output=None))
            last_sampled[idx_mapping] = sampled[:, -1:]  # the postprocess
            proposal = (last_sampled[idx_mapping] + torch.arange(
                1, width, device=device)) % VOCAB  # the drafter
            confidence = torch.sigmoid(logits[:, 1:, 0])
            draft_tokens[idx_mapping] = proposal
            adaptive.record_confidences(confidence, input_batch)
            drafts_out.set_draft_tokens(input_batch,
                                        draft_tokens[idx_mapping, :num_spec_tokens])
            if len(pending) == 2:
                sampled_out.append(pending.pop(0).get_output().sampled_token_ids)
        sampled_out.extend(p.get_output().sampled_token_ids for p in pending)
        drafts.append(drafts_out.get_draft_tokens())
    w.outputs = (sampled_out, drafts, token_counts)
    return w
