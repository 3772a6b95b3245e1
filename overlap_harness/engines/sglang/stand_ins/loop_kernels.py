"""SGLang's raw-pointer kernels on the loop's path, declared to the recorder.

On CUDA, ``alloc_for_extend`` writes a prefill's ``req_to_token`` rows with one Triton kernel
(``write_req_to_token_pool_triton``) fed a device array of the prefix tensors' ``data_ptr()``s,
through ``mem_cache.allocation.write_cache_indices``. No dispatch mode sees what it touches, so
that function is declared as one op: it reads the batch's index and length tensors, every
prefix tensor and ``out_cache_loc``, and writes ``req_to_token[row, :seq_len]`` of each row.
On the CPU its values come from :func:`_write_cache_indices_cpu` (what the kernel computes:
each row's prefix, then its new slots), since the interpreted kernel cannot follow raw
pointers into the recorder's stand-in device memory.
"""

from __future__ import annotations

from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

TARGET = "sglang.srt.mem_cache.allocation:write_cache_indices"


def _write_cache_indices_accesses(result: Any, out_cache_loc: torch.Tensor,
                                  req_pool_indices_tensor: torch.Tensor,
                                  req_pool_indices_cpu: torch.Tensor,
                                  prefix_lens_tensor: torch.Tensor,
                                  prefix_lens_cpu: torch.Tensor, seq_lens_tensor: torch.Tensor,
                                  seq_lens_cpu: torch.Tensor, extend_lens_tensor: torch.Tensor,
                                  extend_lens_cpu: torch.Tensor, prefix_tensors: list[torch.Tensor],
                                  req_to_token_pool: Any) -> list[DeclaredAccess]:
    req_to_token = req_to_token_pool.req_to_token
    out = reads(out_cache_loc) + reads(req_pool_indices_tensor) + reads(prefix_lens_tensor)
    out += reads(seq_lens_tensor) + reads(extend_lens_tensor)
    for prefix in prefix_tensors:
        out += reads(prefix) if prefix.numel() else []
    for row, seq_len in zip(req_pool_indices_cpu.tolist(), seq_lens_cpu.tolist(), strict=True):
        out += writes(req_to_token[row, :seq_len])
    return out


def _write_cache_indices_cpu(out_cache_loc: torch.Tensor, req_pool_indices_tensor: torch.Tensor,
                             req_pool_indices_cpu: torch.Tensor,
                             prefix_lens_tensor: torch.Tensor, prefix_lens_cpu: torch.Tensor,
                             seq_lens_tensor: torch.Tensor, seq_lens_cpu: torch.Tensor,
                             extend_lens_tensor: torch.Tensor, extend_lens_cpu: torch.Tensor,
                             prefix_tensors: list[torch.Tensor], req_to_token_pool: Any) -> None:
    req_to_token = req_to_token_pool.req_to_token
    start = 0
    rows = zip(req_pool_indices_cpu.tolist(), prefix_lens_cpu.tolist(), seq_lens_cpu.tolist(),
               extend_lens_cpu.tolist(), prefix_tensors, strict=True)
    for row, prefix_len, seq_len, extend_len, prefix in rows:
        req_to_token[row, :prefix_len] = prefix[:prefix_len].to(req_to_token.dtype)
        req_to_token[row, prefix_len:seq_len] = out_cache_loc[start:start + extend_len].to(
            req_to_token.dtype)
        start += extend_len


def declare() -> None:
    """Register the declarations (idempotent); they apply inside every recorder watch."""
    recorder.declare_kernel(TARGET, _write_cache_indices_accesses,
                            cpu_impl=_write_cache_indices_cpu,
                            name="write_req_to_token_pool_triton")
