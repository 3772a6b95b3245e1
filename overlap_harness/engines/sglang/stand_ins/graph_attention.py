"""The harness's attention backends' shared part, for SGLang's CUDA-graph runners (decode,
EAGLE's target verify and draft extend): a private copy of the KV indices of the rows a
batch reads, built inside the graph from the scheduler-shared ``req_to_token`` with device
work only (a CUDA graph captures it, on the CPU's fake device and on a real GPU alike).
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes


def copy_row_kv_indices(backend: Any, rows: torch.Tensor, lengths: torch.Tensor) -> None:
    """``backend.kv_indices``/``kv_indptr``: slot ``s``'s entries are
    ``req_to_token[rows[s], :lengths[s]]`` at ``kv_indptr[s]``. Device work only, of static
    shapes (a CUDA graph captures it: no host read of a device value, no host-to-device
    copy); entries past a row's length go to ``kv_indices``' last element, a trash slot no
    read takes (so ``kv_indices`` holds one more element than the rows can fill)."""
    rows = rows.to(torch.int64)
    lengths = lengths.to(torch.int64)
    width = backend.req_to_token.shape[1]
    column = torch.arange(width, device=lengths.device)
    ends = torch.cumsum(lengths, 0)
    backend.kv_indptr[1:rows.numel() + 1] = ends.to(backend.kv_indptr.dtype)
    inside = column.unsqueeze(0) < lengths.unsqueeze(1)
    trash = backend.kv_indices.numel() - 1
    where = torch.where(inside, (ends - lengths).unsqueeze(1) + column.unsqueeze(0),
                        torch.full_like(inside, trash, dtype=torch.int64))
    values = backend.req_to_token.index_select(0, rows).to(backend.kv_indices.dtype)
    backend.kv_indices.scatter_(0, where.reshape(-1), values.reshape(-1))


class PrivateIndexBackend:
    """What the harness's attention backends share (SGLang's ``AttentionBackend`` graph
    contract: ``init_cuda_graph_state``, ``init_forward_metadata_out_graph`` before each
    replay, ``init_forward_metadata_in_graph`` captured): a private copy of the KV indices
    of the rows a batch reads (``kv_indptr``/``kv_indices``, built in the graph from the
    scheduler-shared ``req_to_token``); where the shared reads end is SGLang's base class's
    answer. A subclass says how its in-graph prep builds the copy."""

    needs_cpu_seq_lens = False
    dllm_attention = None
    supports_ragged_verify_graph = False

    def __init__(self, req_to_token: torch.Tensor) -> None:
        self.req_to_token = req_to_token
        self.kv_indices: torch.Tensor | None = None
        self.kv_indptr: torch.Tensor | None = None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """The private metadata buffers the graph reads (sized for the largest batch)."""
        width = self.req_to_token.shape[1]
        # one more element: the trash slot of the prep's entries past a row's length
        self.kv_indices = torch.zeros(max_bs * width + 1, dtype=torch.int32, device="cuda")
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device="cuda")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """Padded rows read one KV index (Triton's and FlashInfer's value)."""
        return 1

    def shared_read_ends(self, forward_mode: Any) -> Any:
        from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

        return AttentionBackend.shared_read_ends(self, forward_mode)

    def init_forward_metadata_out_graph(self, forward_batch: Any,
                                        in_capture: bool = False) -> None:
        """Host-side prep: nothing this backend keeps on the host."""

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Captured: the private copy of the shared ``req_to_token`` rows."""
        raise NotImplementedError(f"{type(self).__name__} builds no in-graph metadata")


def private_index_accesses(backend: Any, forward_batch: Any,
                           rows: list[tuple[int, int]]) -> list[DeclaredAccess]:
    """The accesses of a backend's in-graph metadata prep (:func:`copy_row_kv_indices`): the
    batch's indices and lengths, each of ``rows``' ``req_to_token[row, :length]``, and the
    private index buffers written."""
    out = reads(forward_batch.req_pool_indices) + reads(forward_batch.seq_lens)
    for row, length in rows:
        out += reads(backend.req_to_token[row, :length])
    return out + writes(backend.kv_indices) + writes(backend.kv_indptr)


def _kernel_values() -> Any:
    """Where a declared op's body computes its values: on the device in the real kernel, so
    its reads of index values are not host reads of the program (no torch-function hooks)."""
    return torch._C.DisableTorchFunction()


def _static_rows(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
                 ) -> list[tuple[int, int]]:
    """(row, length) of each static slot, from the device buffers' values of the moment (the
    recorder computes them on the host in CPU mode; a replay reads them again)."""
    return list(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True))
