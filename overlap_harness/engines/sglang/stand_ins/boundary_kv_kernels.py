"""SGLang's three Triton kernels of the multi-layer EAGLE worker's boundary-KV window,
declared to the recorder where the worker looks them up (``multi_layer_eagle_worker_v2``'s
module names, imported there from ``multi_layer_eagle_utils``).

The window (``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX`` with a hybrid model's pool) widens each
request's draft extend by ``front`` rows below the committed length, fed from a per-request
stash of the last committed (token, hidden) pairs. Each declaration names what the kernel
reads and writes (read from its source, ``sglang/kernels/ops/speculative/multi_layer_eagle.py``,
the same in 0.5.17-0.5.23), and a CPU implementation computes the same values (written here
from what each kernel does, not from its code):

* ``compute_widened_draft_extend_locs_positions`` (``_compute_boundary_kv_locs_positions``):
  per request, positions ``seq_len - front + j`` for ``j < front + W``; reads the lengths, the
  rows, the stash's valid lengths at each row and ``req_to_token[row, max(pos, 0)]`` over the
  window; writes fresh ``locs`` and ``positions`` (a front row without stash data: position 0;
  it and the first warm-up rows of valid data: the sacrificial slot 0);
* ``stash_append_boundary_state_triton`` (``_seed_boundary_kv_stash`` after a prefill's
  draft extend, ``_fill_boundary_kv_front_and_update_stash`` after a verify): per request,
  ``m = min(available, front)`` newest committed pairs ``src[end - m:end]`` rolled into its
  stash row (the kept ``front - m`` old pairs shifted down, read first), its valid length set
  (prefill) or grown (decode: read, then written);
* ``fill_widened_draft_extend_inputs_triton``: per request, its window of ``front + W`` rows
  of the draft extend's ``input_ids`` and hidden states: the front rows from its stash row
  (those without valid data zeroed), the others from the verify's ``predict`` and hiddens.

and the one kernel SGLang's shared preparation launches only for a widened window,
``prepare_draft_extend_lengths`` (``eagle_worker_common.prepare_for_draft_extend`` from 0.5.22,
on device-only lengths; ``kernels/ops/speculative/eagle.py``): reads the lengths, writes fresh
prefix lengths ``max(seq_len - front, 0)``, extend lengths ``W + front`` and post-write lengths
``seq_len + W``. Earlier releases compute them with torch ops (recorded as they run).
"""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins.eagle_models import device_tensor, peek
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

WORKER_MODULE = "sglang.srt.speculative.multi_layer_eagle_worker_v2"


def _first_valid(front: int, valid_len: int, seq_len: int) -> int:
    """The first front row that holds stash data (rows below: no committed pair there)."""
    return max(front - valid_len, front - seq_len, 0)


# -- compute_widened_draft_extend_locs_positions -------------------------------------------


def _windows(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
             stash_valid_lens: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, seq_len, stash valid length) of each request."""
    valid = peek(stash_valid_lens)
    return [(row, seq_len, valid[row]) for row, seq_len in
            zip(peek(req_pool_indices), peek(seq_lens), strict=True)]


def widened_locs_positions(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                           req_to_token: torch.Tensor, stash_valid_lens: torch.Tensor,
                           draft_token_num: int, num_front_tokens: int,
                           num_warmup_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The widened window's KV slots and positions, request after request."""
    width = draft_token_num + num_front_tokens
    table = peek(req_to_token)
    locs: list[int] = []
    positions: list[int] = []
    for row, seq_len, valid_len in _windows(seq_lens, req_pool_indices, stash_valid_lens):
        first_valid = _first_valid(num_front_tokens, valid_len, seq_len)
        first_real = min(first_valid + num_warmup_tokens, num_front_tokens)
        for j in range(width):
            position = seq_len - num_front_tokens + j
            locs.append(table[row][max(position, 0)] if j >= first_real else 0)
            positions.append(position if j >= first_valid else 0)
    return (device_tensor(locs, seq_lens, torch.int64),
            device_tensor(positions, seq_lens, torch.int64))


def widened_locs_accesses(out: Any, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                          req_to_token: torch.Tensor, stash_valid_lens: torch.Tensor,
                          draft_token_num: int, num_front_tokens: int,
                          num_warmup_tokens: int) -> list[DeclaredAccess]:
    locs, positions = out
    acc = reads(seq_lens) + reads(req_pool_indices)
    acc += reads(stash_valid_lens, rows=req_pool_indices)
    for row, seq_len, _valid in _windows(seq_lens, req_pool_indices, stash_valid_lens):
        start = max(seq_len - num_front_tokens, 0)  # a negative position reads entry 0
        acc += reads(req_to_token[row, start:seq_len + draft_token_num])
    return acc + writes(locs) + writes(positions)


# -- stash_append_boundary_state_triton ------------------------------------------------------


def _appends(src_row_ends: torch.Tensor, num_available: torch.Tensor,
             req_pool_indices: torch.Tensor, front: int) -> list[tuple[int, int, int]]:
    """(stash row, source end, m) of each request: ``m`` pairs end at ``end``."""
    return [(row, end, min(available, front)) for row, end, available in
            zip(peek(req_pool_indices), peek(src_row_ends), peek(num_available), strict=True)]


def stash_append(src_tokens: torch.Tensor, src_hiddens: torch.Tensor,
                 src_row_ends: torch.Tensor, num_available: torch.Tensor,
                 req_pool_indices: torch.Tensor, stash_tokens: torch.Tensor,
                 stash_hiddens: torch.Tensor, stash_valid_lens: torch.Tensor,
                 set_valid: bool) -> None:
    """Each request's stash row rolled forward by its newest committed pairs."""
    front = stash_tokens.shape[1]
    tokens, hiddens = peek(src_tokens), peek(src_hiddens)
    stash_t, stash_h, valid = peek(stash_tokens), peek(stash_hiddens), peek(stash_valid_lens)
    for row, end, m in _appends(src_row_ends, num_available, req_pool_indices, front):
        stash_t[row] = stash_t[row][m:] + tokens[end - m:end]
        stash_h[row] = stash_h[row][m:] + hiddens[end - m:end]
        valid[row] = m if set_valid else min(valid[row] + m, front)
    stash_tokens.copy_(device_tensor(stash_t, stash_tokens))
    stash_hiddens.copy_(device_tensor(stash_h, stash_hiddens))
    stash_valid_lens.copy_(device_tensor(valid, stash_valid_lens))


def stash_append_accesses(out: Any, src_tokens: torch.Tensor, src_hiddens: torch.Tensor,
                          src_row_ends: torch.Tensor, num_available: torch.Tensor,
                          req_pool_indices: torch.Tensor, stash_tokens: torch.Tensor,
                          stash_hiddens: torch.Tensor, stash_valid_lens: torch.Tensor,
                          set_valid: bool) -> list[DeclaredAccess]:
    front = stash_tokens.shape[1]
    acc = reads(req_pool_indices) + reads(src_row_ends) + reads(num_available)
    for row, end, m in _appends(src_row_ends, num_available, req_pool_indices, front):
        acc += reads(src_tokens[end - m:end]) + reads(src_hiddens[end - m:end])
        if m < front:  # the kept old pairs are read before the row is written
            acc += reads(stash_tokens[row, m:]) + reads(stash_hiddens[row, m:])
        acc += writes(stash_tokens[row]) + writes(stash_hiddens[row])
        if not set_valid:
            acc += reads(stash_valid_lens[row:row + 1])
        acc += writes(stash_valid_lens[row:row + 1])
    return acc


# -- fill_widened_draft_extend_inputs_triton -------------------------------------------------


def fill_widened_inputs(input_ids: torch.Tensor, hidden_states: torch.Tensor,
                        predict: torch.Tensor, verify_hiddens: torch.Tensor,
                        stash_tokens: torch.Tensor, stash_hiddens: torch.Tensor,
                        stash_valid_lens: torch.Tensor, seq_lens: torch.Tensor,
                        req_pool_indices: torch.Tensor, draft_token_num: int) -> None:
    """The widened windows' tokens and hiddens: stash rows in front, the verify's after."""
    front = stash_tokens.shape[1]
    width = draft_token_num + front
    tokens, hiddens = peek(predict), peek(verify_hiddens)
    stash_t, stash_h = peek(stash_tokens), peek(stash_hiddens)
    ids, window_h = peek(input_ids), peek(hidden_states)
    zero = [0.0] * hidden_states.shape[1]
    for i, (row, seq_len, valid_len) in enumerate(
            _windows(seq_lens, req_pool_indices, stash_valid_lens)):
        first_valid = _first_valid(front, valid_len, seq_len)
        for j in range(width):
            if j >= front:
                source = i * draft_token_num + j - front
                ids[i * width + j], window_h[i * width + j] = tokens[source], hiddens[source]
            elif j >= first_valid:
                ids[i * width + j], window_h[i * width + j] = stash_t[row][j], stash_h[row][j]
            else:
                ids[i * width + j], window_h[i * width + j] = 0, zero
    input_ids.copy_(device_tensor(ids, input_ids))
    hidden_states.copy_(device_tensor(window_h, hidden_states))


def fill_widened_accesses(out: Any, input_ids: torch.Tensor, hidden_states: torch.Tensor,
                          predict: torch.Tensor, verify_hiddens: torch.Tensor,
                          stash_tokens: torch.Tensor, stash_hiddens: torch.Tensor,
                          stash_valid_lens: torch.Tensor, seq_lens: torch.Tensor,
                          req_pool_indices: torch.Tensor, draft_token_num: int
                          ) -> list[DeclaredAccess]:
    front = stash_tokens.shape[1]
    width = draft_token_num + front
    acc = reads(req_pool_indices) + reads(seq_lens)
    acc += reads(stash_valid_lens, rows=req_pool_indices)
    for i, (row, seq_len, valid_len) in enumerate(
            _windows(seq_lens, req_pool_indices, stash_valid_lens)):
        first_valid = _first_valid(front, valid_len, seq_len)
        if first_valid < front:
            acc += reads(stash_tokens[row, first_valid:])
            acc += reads(stash_hiddens[row, first_valid:])
        verified = slice(i * draft_token_num, (i + 1) * draft_token_num)
        acc += reads(predict[verified]) + reads(verify_hiddens[verified])
        acc += writes(input_ids[i * width:(i + 1) * width])
        acc += writes(hidden_states[i * width:(i + 1) * width])
    return acc


# -- eagle_worker_common.prepare_draft_extend_lengths ----------------------------------------


def draft_extend_lengths(seq_lens: torch.Tensor, num_draft_tokens: int, front_offset: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prefix, extend and post-write lengths of a widened draft extend."""
    lengths = peek(seq_lens)
    return (device_tensor([max(n - front_offset, 0) for n in lengths], seq_lens, torch.int32),
            device_tensor([num_draft_tokens + front_offset] * len(lengths), seq_lens,
                          torch.int32),
            device_tensor([n + num_draft_tokens for n in lengths], seq_lens))


def draft_extend_lengths_accesses(out: Any, seq_lens: torch.Tensor, num_draft_tokens: int,
                                  front_offset: int) -> list[DeclaredAccess]:
    return reads(seq_lens) + [w for t in out for w in writes(t)]


def declare() -> None:
    """Register the declarations (idempotent; a release without a name skips it)."""
    recorder.declare_kernel(f"{WORKER_MODULE}:compute_widened_draft_extend_locs_positions",
                            widened_locs_accesses, cpu_impl=widened_locs_positions,
                            name="compute_widened_draft_extend_locs_positions_kernel")
    recorder.declare_kernel(f"{WORKER_MODULE}:stash_append_boundary_state_triton",
                            stash_append_accesses, cpu_impl=stash_append,
                            name="stash_append_boundary_state_kernel")
    recorder.declare_kernel(f"{WORKER_MODULE}:fill_widened_draft_extend_inputs_triton",
                            fill_widened_accesses, cpu_impl=fill_widened_inputs,
                            name="fill_widened_draft_extend_inputs_kernel")
    recorder.declare_kernel("sglang.srt.speculative.eagle_worker_common:"
                            "prepare_draft_extend_lengths", draft_extend_lengths_accesses,
                            cpu_impl=draft_extend_lengths,
                            name="_prepare_draft_extend_lengths_kernel")
