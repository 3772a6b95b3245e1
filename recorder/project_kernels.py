"""Declarations for the project's own kernels that the dispatcher cannot see.

The spec-extras gather's Triton version (``model.kernels.gather._gather_triton``) is one raw
Triton launch: it reads ``indices`` and the rows it names of each relay buffer, and writes its
fresh outputs. Declared here (model/ stays free of the recorder); in CPU mode, where Triton
cannot launch, the unfused gather computes the same values.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.model.kernels.gather import gather_spec_extras
from overlap_harness.recorder.kernels import DeclaredAccess, declare_kernel, reads, writes

GATHER_TRITON = "overlap_harness.model.kernels.gather:_gather_triton"


def gather_accesses(result: Any, indices: torch.Tensor, topk_p_buf: torch.Tensor,
                    topk_index_buf: torch.Tensor, output_tokens_buf: torch.Tensor,
                    hidden_states_buf: torch.Tensor | None) -> list[DeclaredAccess]:
    """The Triton gather reads ``indices`` and the rows it names; writes every output."""
    out = reads(indices)
    for buf in (topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
        out += reads(buf, rows=indices)
    for tensor in result:
        out += writes(tensor)
    return out


def gather_on_cpu(indices: torch.Tensor, topk_p_buf: torch.Tensor, topk_index_buf: torch.Tensor,
                  output_tokens_buf: torch.Tensor,
                  hidden_states_buf: torch.Tensor | None) -> tuple[Any, ...]:
    """The Triton gather's values, computed by the unfused reference."""
    return tuple(gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf,
                                    hidden_states_buf, impl="unfused"))


def register() -> None:
    """Declare the project's kernels (idempotent)."""
    declare_kernel(GATHER_TRITON, gather_accesses, cpu_impl=gather_on_cpu, name="gather_triton")
