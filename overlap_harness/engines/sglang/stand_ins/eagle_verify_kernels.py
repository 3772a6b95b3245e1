"""SGLang's Triton kernels of the EAGLE verify that older releases reach on every verify (later
releases fuse them into the verify's commit kernel, declared in :mod:`.stand_ins.eagle_kernels`),
declared to the recorder with the same conventions.

Each is declared where the path looks it up (``"module:function"`` of the calling module); a
release whose path never names one leaves its declaration unused.
"""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang.stand_ins.eagle_models import device_tensor, peek
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

# -- kernels.ops.speculative.eagle.fill_bonus_tokens_func --------------------------------


def _bonus_cells(accept_lens: torch.Tensor, accept_stride: int, batch_size: int) -> list[int]:
    """The flat index in ``accept_tokens`` of each request's bonus token: the last accepted
    slot of its row of ``accept_stride`` (``accept_lens`` counts the bonus token)."""
    return [lane * accept_stride + length - 1
            for lane, length in enumerate(peek(accept_lens)[:batch_size])]


def _fill_bonus(accept_tokens: torch.Tensor, accept_lens: torch.Tensor,
                bonus_tokens: torch.Tensor, accept_stride: int, batch_size: int) -> None:
    """``bonus_tokens[i]``: request ``i``'s last accepted token."""
    tokens = peek(accept_tokens.reshape(-1))
    cells = _bonus_cells(accept_lens, accept_stride, batch_size)
    if cells:
        bonus_tokens[:len(cells)] = device_tensor([tokens[c] for c in cells], bonus_tokens)


def _fill_bonus_accesses(out: Any, accept_tokens: torch.Tensor, accept_lens: torch.Tensor,
                         bonus_tokens: torch.Tensor, accept_stride: int, batch_size: int
                         ) -> list[DeclaredAccess]:
    acc = reads(accept_lens[:batch_size]) + writes(bonus_tokens[:batch_size])
    flat = accept_tokens.reshape(-1)
    for cell in _bonus_cells(accept_lens, accept_stride, batch_size):
        acc += reads(flat[cell:cell + 1])
    return acc


# -- kernels.ops.speculative.cache_locs.assign_extend_cache_locs (launched raw) ----------


def _extend_windows(req_pool_indices: torch.Tensor, start_offset: torch.Tensor,
                    end_offset: torch.Tensor, grid: Any) -> list[tuple[int, int, int, int]]:
    """(row, start, end, out offset) of each program of the launch's grid: request ``i``'s
    ``req_to_token[row, start:end]`` lands in ``out_cache_loc`` after the windows of the
    requests before it."""
    programs = grid[0] if isinstance(grid, tuple) else grid
    if not isinstance(programs, int):
        raise NotImplementedError(f"assign_extend_cache_locs: grid {grid!r} is not planned")
    windows, offset = [], 0
    for row, start, end in zip(peek(req_pool_indices)[:programs], peek(start_offset)[:programs],
                               peek(end_offset)[:programs], strict=True):
        windows.append((row, start, end, offset))
        offset += end - start
    return windows


def _extend_cache_locs(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                       start_offset: torch.Tensor, end_offset: torch.Tensor,
                       out_cache_loc: torch.Tensor, pool_len: int, bs_upper: int, *,
                       grid: Any, **launch: Any) -> None:
    """Each request's slots ``req_to_token[row, start:end]``, packed in order."""
    for row, start, end, offset in _extend_windows(req_pool_indices, start_offset,
                                                   end_offset, grid):
        if end > start:
            out_cache_loc[offset:offset + end - start] = req_to_token[row, start:end].to(
                out_cache_loc.dtype)


def _extend_cache_locs_accesses(out: Any, req_pool_indices: torch.Tensor,
                                req_to_token: torch.Tensor, start_offset: torch.Tensor,
                                end_offset: torch.Tensor, out_cache_loc: torch.Tensor,
                                pool_len: int, bs_upper: int, *, grid: Any, **launch: Any
                                ) -> list[DeclaredAccess]:
    windows = _extend_windows(req_pool_indices, start_offset, end_offset, grid)
    programs = len(windows)
    acc = reads(req_pool_indices[:programs]) + reads(start_offset[:programs])
    acc += reads(end_offset[:programs])
    for row, start, end, offset in windows:
        if end > start:
            acc += reads(req_to_token[row, start:end])
            acc += writes(out_cache_loc[offset:offset + end - start])
    return acc


def declare() -> None:
    """Register the declarations (idempotent). The raw kernel is declared where a release's
    spec_utils launches it itself (``kernel[(bs,)](...)``, 0.5.22's
    ``move_accept_tokens_to_target_kvcache``), found as a Triton kernel object there."""
    import importlib

    spec_utils = importlib.import_module("sglang.srt.speculative.spec_utils")
    raw = getattr(spec_utils, "assign_extend_cache_locs", None)
    if raw is not None and hasattr(raw, "run"):
        recorder.declare_kernel(raw, _extend_cache_locs_accesses, cpu_impl=_extend_cache_locs,
                                name="assign_extend_cache_locs")
    recorder.declare_kernel("sglang.srt.speculative.eagle_worker_common:fill_bonus_tokens_func",
                            _fill_bonus_accesses, cpu_impl=_fill_bonus,
                            name="fill_bonus_tokens")
