"""The fake target and draft model forwards of SGLang's EAGLE v2 worker, declared.

SGLang's ``EAGLEWorkerV2`` and its ``EagleDraftWorker`` run as they are (draft, verify,
draft-extend, the tree and commit bookkeeping, the plan stream); what needs weights is
replaced here, each forward one declared op on the current stream with the accesses of the
real kernels:

* the target worker (SGLang's ``TpModelWorker``): a prefill (``capture_hidden_mode=FULL``)
  writes the new KV slots of the target KV pool, reads ``req_to_token[row, :seq_len]`` of each
  row and the KV slots they name, and writes the sampled tokens and one hidden state per
  token; a verify (``is_verify=True``, the ``ForwardBatch`` SGLang built) reads the draft
  tokens, positions, the tree mask and ``req_to_token[row, :seq_len + draft_tokens]`` with
  those KV slots, writes the verify slots' KV, the logits of every draft token and their
  hidden states;
* the draft model runner's ``forward`` (draft decode steps, draft-extend after a prefill or a
  verify): reads ``input_ids``, ``positions``, the carried hidden states, the page table its
  backend planned and ``req_to_token[row, :seq_len]`` (a decode step: the prefix and the draft
  slots of the steps so far) with the draft KV slots named, writes the draft KV of
  ``out_cache_loc``, logits and hidden states.

Rows and lengths are device values (spec v2 keeps ``seq_lens`` on the device; with
``needs_cpu_seq_lens`` off there is no host copy): a declaration needs them to say which
memory the kernel touches, so it reads the recorder's values (issue order) without recording a
host read, which the real kernel does not make (:func:`peek`).
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

VOCAB = 1000
HIDDEN = 4  # hidden-state width carried from target to draft and between draft steps


def peek(tensor: torch.Tensor) -> list[Any]:
    """The values of a device tensor for a declaration, without a recorded host read (the
    kernel reads them on the device; the declaration needs them to name the memory)."""
    with torch._C.DisableTorchFunction():
        return tensor.tolist()


def on_real_device(tensor: torch.Tensor) -> bool:
    """The tensor is in a real GPU's memory (a device run), not a CPU tensor the CPU mode
    shows as CUDA: what torch itself says, below the CPU mode's function mode."""
    with torch._C.DisableTorchFunction():
        return tensor.is_cuda


def device_tensor(values: list[Any], like: torch.Tensor,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh device tensor holding ``values``, written as the kernel's output (no host
    copy is recorded: the kernel computes them on the device). On a real device the values
    travel from pinned memory without blocking: a blocking copy from pageable memory would
    make the host wait for the stream's earlier work, a synchronisation SGLang's kernel
    does not make (the pinned block stays alive until the copy is done: torch's host
    allocator records the copy's stream)."""
    with torch._C.DisableTorchFunction():
        host = torch.tensor(values, dtype=dtype or like.dtype)
    out = torch.empty(host.shape, dtype=host.dtype, device=like.device)
    if on_real_device(like):
        out.copy_(host.pin_memory(), non_blocking=True)
    else:
        out.copy_(host)
    return out


def fill_slots(buffer: torch.Tensor, slots: torch.Tensor, value: float) -> None:
    """``buffer[slots] = value``, the KV write of a forward stand-in. On a real device as an
    ``index_fill_`` on the device: the assignment would move the Python scalar from the host
    first, a blocking copy that waits for the stream (and that a CUDA graph capture refuses)."""
    if on_real_device(buffer):
        buffer.index_fill_(0, slots.to(torch.int64), value)
    else:
        buffer[slots] = value


def draft_windows(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
                  ) -> list[tuple[int, int]]:
    """(row, start) of each request: where its window of new slots begins."""
    return list(zip(peek(req_pool_indices), peek(seq_lens), strict=True))


def _token_rows(req_to_token: torch.Tensor, rows: list[int], lengths: list[int],
                kv: torch.Tensor) -> list[DeclaredAccess]:
    """Attention's reads: each row's ``req_to_token[row, :length]`` and the KV slots named."""
    out: list[DeclaredAccess] = []
    for row, length in zip(rows, lengths, strict=True):
        entries = req_to_token[row, :length]
        out += reads(entries)
        out += reads(kv, rows=entries)
    return out


def _logits_of(positions: torch.Tensor, shift: int) -> torch.Tensor:
    """Logits whose argmax is a function of the position: target and draft agree on some
    positions (accepted drafts) and not on others (rejected ones)."""
    logits = torch.zeros((positions.shape[0], VOCAB), dtype=torch.float32,
                         device=positions.device)
    best = (positions.to(torch.int64) * 7 + shift * (positions.to(torch.int64) % 3 == 0)) % 97 + 1
    logits.scatter_(1, best.view(-1, 1), 1.0)
    return logits


logits_of = _logits_of  # the same values for the verify replayed under a CUDA graph


# -- attention metadata planning ---------------------------------------------------------


def _plan_accesses(out: torch.Tensor, backend: Any, req_to_token: torch.Tensor,
                   forward_batch: Any) -> list[DeclaredAccess]:
    acc = reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    rows, lengths = peek(forward_batch.req_pool_indices), peek(forward_batch.seq_lens)
    for row, length in zip(rows, lengths, strict=True):
        acc += reads(req_to_token[row, :length])
    return acc + writes(out)


@declared(_plan_accesses, name="init_forward_metadata")
def _plan(backend: Any, req_to_token: torch.Tensor, forward_batch: Any) -> torch.Tensor:
    """The backend's page table: the batch's ``req_to_token`` rows (attention reads each one
    up to its length, as declared)."""
    rows = forward_batch.req_pool_indices.to(torch.int64)
    table = req_to_token[rows].clone()
    backend.forward_metadata = table
    return table


def planning_backend(name: str, req_to_token: torch.Tensor, **fields: Any) -> StrictStub:
    """An attention backend stand-in whose ``init_forward_metadata`` is declared as the real
    one's kernels: it reads the batch's rows and lengths and ``req_to_token[row, :seq_len]``,
    and writes the page table (``forward_metadata``) the forward then reads."""
    backend = StrictStub(name, forward_metadata=None, **fields)
    backend.init_forward_metadata = lambda forward_batch: _plan(backend, req_to_token,
                                                                 forward_batch)
    return backend


# -- the target worker -------------------------------------------------------------------


def _prefill_accesses(out: Any, worker: FakeTargetWorker, batch: Any, **kwargs: Any
                      ) -> list[DeclaredAccess]:
    req_to_token = worker.req_to_token_pool.req_to_token
    acc = reads(batch.input_ids) + reads(batch.req_pool_indices) + reads(batch.seq_lens)
    acc += reads(batch.out_cache_loc) + writes(worker.kv_buffer, rows=batch.out_cache_loc)
    acc += _token_rows(req_to_token, batch.req_pool_indices_cpu.tolist(),
                       batch.seq_lens_cpu.tolist(), worker.kv_buffer)
    tokens, hidden = out
    return acc + writes(tokens) + writes(hidden)


@declared(_prefill_accesses, name="target_prefill_forward")
def _target_prefill(worker: FakeTargetWorker, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled tokens (one per request) and hidden states (one per token) of a prefill."""
    fill_slots(worker.kv_buffer, batch.out_cache_loc, 1.0)  # set_kv_buffer
    seq_lens = batch.seq_lens.to(torch.int64)
    tokens = (seq_lens * 7) % 97 + 1
    hidden = batch.input_ids.to(torch.float32).view(-1, 1).expand(-1, HIDDEN).contiguous()
    return tokens, hidden


def _verify_accesses(out: Any, worker: FakeTargetWorker, forward_batch: Any
                     ) -> list[DeclaredAccess]:
    req_to_token = worker.req_to_token_pool.req_to_token
    spec = forward_batch.spec_info
    width = spec.draft_token_num
    acc = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    acc += reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    mask = worker.model_runner.attn_backend.verify_mask
    if mask is None or mask.is_read:  # a chain verify (topk 1) is causal: no mask read
        acc += reads(spec.custom_mask)
    acc += reads(forward_batch.out_cache_loc)
    acc += writes(worker.kv_buffer, rows=forward_batch.out_cache_loc)
    lengths = [n + width for n in peek(forward_batch.seq_lens)]
    acc += _token_rows(req_to_token, peek(forward_batch.req_pool_indices), lengths,
                       worker.kv_buffer)
    logits, hidden = out
    return acc + writes(logits) + writes(hidden)


@declared(_verify_accesses, name="target_verify_forward")
def _target_verify(worker: FakeTargetWorker, forward_batch: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and hidden states of every draft token of the tree."""
    fill_slots(worker.kv_buffer, forward_batch.out_cache_loc, 1.0)
    logits = _logits_of(forward_batch.positions, 0)
    hidden = forward_batch.input_ids.to(torch.float32).view(-1, 1).expand(-1, HIDDEN)
    return logits, hidden.contiguous()


def _move_accesses(out: Any, kv_buffer: torch.Tensor, tgt_loc: torch.Tensor,
                   src_loc: torch.Tensor) -> list[DeclaredAccess]:
    return (reads(tgt_loc) + reads(src_loc) + reads(kv_buffer, rows=src_loc)
            + writes(kv_buffer, rows=tgt_loc))


@declared(_move_accesses, name="move_kv_cache")
def _move_kv_cache(kv_buffer: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
                   ) -> None:
    """The KV pool's ``move_kv_cache``: the accepted tree path's KV to the front slots."""
    kv_buffer[tgt_loc] = kv_buffer[src_loc].clone()


class FakeTargetWorker:
    """Stands where SGLang's target ``TpModelWorker`` stands under ``EAGLEWorkerV2``: the
    prefill and verify forwards, and the fields the worker and scheduler read."""

    def __init__(self, req_to_token_pool: Any, allocator: Any, kv_tokens: int,
                 model_runner: Any) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.model_runner = model_runner
        self.model_config = model_runner.model_config
        self.kv_buffer = torch.zeros((kv_tokens + 1, 1), dtype=torch.float32, device="cuda")
        self.forwards = 0
        # SGLang's target-verify graph runner (eagle_graph.VerifyGraphs), when a variant asks
        self.verify_graphs: Any = None

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """The target KV pool's slot move (a tree verify keeps the accepted path)."""
        _move_kv_cache(self.kv_buffer, tgt_loc, src_loc)

    def forward_batch_generation(self, batch: Any = None, *, forward_batch: Any = None,
                                 is_verify: bool = False, pp_proxy_tensors: Any = None,
                                 capture_hidden_mode: Any = None,
                                 return_kv_loc_plan: bool = False) -> Any:
        """A prefill of ``batch`` or the verify of ``forward_batch``; SGLang's result."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        if pp_proxy_tensors is not None:
            raise TypeError("forward_batch_generation: pipeline parallel is not planned")
        self.forwards += 1
        if is_verify and self.verify_graphs is not None and (
                not forward_batch.needs_forward_metadata_init()):
            # load_batch staged it in the plan-stream block: ModelRunner.forward replays
            return GenerationBatchResult(logits_output=self.verify_graphs.execute(forward_batch),
                                         can_run_cuda_graph=True)
        if is_verify:
            logits, hidden = _target_verify(self, forward_batch)
            return GenerationBatchResult(
                logits_output=LogitsProcessorOutput(next_token_logits=logits,
                                                    hidden_states=hidden),
                can_run_cuda_graph=False)
        tokens, hidden = _target_prefill(self, batch)
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None, hidden_states=hidden),
            next_token_ids=tokens, can_run_cuda_graph=False)
        result.kv_loc_plan = None  # no KV index translation (a plain pool)
        return result


# -- the draft model runner --------------------------------------------------------------


def _draft_window_reads(runner: FakeDraftRunner, forward_batch: Any) -> list[DeclaredAccess]:
    """A draft decode step's attention: each request's prefix ``req_to_token[row, :seq_len]``
    and, per branch, the draft slots of the steps so far (the draft window is laid out branch
    by branch after ``seq_len``: ``per_step_draft_out_cache_loc``), with the KV they name."""
    req_to_token = runner.req_to_token_pool.req_to_token
    rows, lengths = peek(forward_batch.req_pool_indices), peek(forward_batch.seq_lens)
    positions = peek(forward_batch.positions)[::runner.topk]
    acc: list[DeclaredAccess] = []
    for row, length, position in zip(rows, lengths, positions, strict=True):
        step = position - length
        spans = [(0, length)] + [(length + branch * runner.num_steps,
                                  length + branch * runner.num_steps + step + 1)
                                 for branch in range(runner.topk)]
        for start, end in spans:
            entries = req_to_token[row, start:end]
            acc += reads(entries) + reads(runner.kv_buffer, rows=entries)
    return acc


def _draft_accesses(out: Any, runner: FakeDraftRunner, forward_batch: Any
                    ) -> list[DeclaredAccess]:
    req_to_token = runner.req_to_token_pool.req_to_token
    spec = forward_batch.spec_info
    mode = forward_batch.forward_mode
    acc = reads(forward_batch.input_ids) + reads(forward_batch.positions)
    acc += reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    acc += reads(getattr(spec, "hidden_states", None)) + reads(forward_batch.out_cache_loc)
    acc += writes(runner.kv_buffer, rows=forward_batch.out_cache_loc.reshape(-1))
    if mode.is_extend() or mode.is_draft_extend_v2():
        acc += _token_rows(req_to_token, peek(forward_batch.req_pool_indices),
                           peek(forward_batch.seq_lens), runner.kv_buffer)
    else:
        acc += _draft_window_reads(runner, forward_batch)
    if mode.is_extend():
        acc += reads(forward_batch.extend_seq_lens)
    acc += reads(runner.planned_metadata(forward_batch))
    logits, hidden = out
    return acc + writes(logits) + writes(hidden)


@declared(_draft_accesses, name="draft_forward")
def _draft_forward(runner: FakeDraftRunner, forward_batch: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    fill_slots(runner.kv_buffer, forward_batch.out_cache_loc.reshape(-1), 1.0)
    logits = _logits_of(forward_batch.positions + 1, 1)
    hidden = forward_batch.input_ids.to(torch.float32).view(-1, 1).expand(-1, HIDDEN)
    if forward_batch.forward_mode.is_extend():
        # a prefill's draft extend: the logits processor keeps each request's last token
        last = torch.cumsum(forward_batch.extend_seq_lens, 0) - 1
        return logits[last], hidden[last].contiguous()
    return logits, hidden.contiguous()


class FakeDraftRunner:
    """The fields of SGLang's draft ``ModelRunner`` the EAGLE worker reads, and its
    ``forward`` (declared). Set by :mod:`.features.eagle`."""

    def __init__(self, req_to_token_pool: Any, kv_tokens: int, **fields: Any) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.kv_buffer = torch.zeros((kv_tokens + 1, 1), dtype=torch.float32, device="cuda")
        self.forwards = 0
        for key, value in fields.items():
            setattr(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        from overlap_harness.engines.core.strict import UnplannedUseError

        raise UnplannedUseError(f"draft_runner.{name}: not planned by the driver")

    def planned_metadata(self, forward_batch: Any) -> torch.Tensor | None:
        """The page table the forward's backend planned (draft decode steps: the multi-step
        backend; draft extend: the runner's own), None when none was planned."""
        mode = forward_batch.forward_mode
        if mode.is_extend() or mode.is_draft_extend_v2():
            return self.attn_backend.forward_metadata
        return self.draft_attn_backend.forward_metadata

    def forward(self, forward_batch: Any, **kwargs: Any) -> Any:
        """One draft forward: SGLang's ``ModelRunnerOutput``-like result (``logits_output``)."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if kwargs:
            raise TypeError(f"draft_runner.forward: unplanned arguments {sorted(kwargs)}")
        self.forwards += 1
        logits, hidden = _draft_forward(self, forward_batch)
        return StrictStub("draft_forward_output", logits_output=LogitsProcessorOutput(
            next_token_logits=logits, hidden_states=hidden))
