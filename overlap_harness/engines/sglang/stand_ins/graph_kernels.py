"""SGLang's raw-pointer kernels on the decode CUDA-graph path, declared to the recorder.

* ``clamp_position_cuda`` (a JIT CUDA kernel ``ForwardBatch.init_new`` launches for decode
  positions, compiled on first use): reads ``seq_lens``, writes the fresh positions; its CPU
  values are ``clamp(seq_lens - 1, min=0)`` (the rule its docstring states).
* ``try_small_copy`` (the runner's grouped copy of a batch into the static input buffers, one
  Triton launch for all pairs): SGLang's own function decides whether it applies (dtype,
  shape, size and overlap checks on the host, which read ``data_ptr()``s: quiet inside the
  declaration); when it does, it reads every source and writes every destination. In CPU mode
  its Triton kernel is replaced, for the call, by :class:`_CopyPairs`, which copies each pair
  (the interpreted kernel would follow raw pointers into the recorder's stand-in memory).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

CLAMP_POSITION = "sglang.kernels.ops.attention.clamp_position:clamp_position_cuda"
SMALL_COPY_MODULE = "sglang.kernels.ops.memory.small_copy"
SMALL_COPY = f"{SMALL_COPY_MODULE}:try_small_copy"


def _clamp_position_accesses(result: torch.Tensor, seq_lens: torch.Tensor
                             ) -> list[DeclaredAccess]:
    return reads(seq_lens) + writes(result)


def _clamp_position_cpu(seq_lens: torch.Tensor) -> torch.Tensor:
    return torch.clamp(seq_lens - 1, min=0).to(seq_lens.dtype)


def _small_copy_accesses(result: bool, dsts: list[torch.Tensor], srcs: list[torch.Tensor]
                         ) -> list[DeclaredAccess]:
    if not result:  # not applicable: nothing launched (the caller copies another way)
        return []
    out: list[DeclaredAccess] = []
    for src in srcs:
        out += reads(src)
    for dst in dsts:
        out += writes(dst)
    return out


class _CopyPairs:
    """Stands for ``_small_copy_kernel[grid](srcs, dsts, ...)``: copies each pair."""

    def __getitem__(self, grid: Any) -> Any:
        def launch(srcs: tuple, dsts: tuple, *args: Any, **kwargs: Any) -> None:
            for src, dst in zip(srcs, dsts, strict=True):
                dst.copy_(src)
        return launch


def _small_copy_cpu(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> bool:
    """SGLang's ``try_small_copy`` with its Triton kernel replaced by :class:`_CopyPairs`."""
    module = sys.modules[SMALL_COPY_MODULE]
    with attributes_set([(module, "_small_copy_kernel", _CopyPairs())]):
        return bool(_ORIGINAL_SMALL_COPY[0](dsts, srcs))


_ORIGINAL_SMALL_COPY: list[Any] = []  # the unpatched function, taken when declared


def declare() -> None:
    """Register the declarations (idempotent; before the watch starts: they are patched in
    when it does)."""
    import importlib
    import importlib.util

    recorder.declare_kernel(CLAMP_POSITION, _clamp_position_accesses,
                            cpu_impl=_clamp_position_cpu, name="clamp_position")
    # releases before the small-copy kernel copy the graph's static inputs with torch ops
    if importlib.util.find_spec(SMALL_COPY_MODULE) is None:
        return
    module = importlib.import_module(SMALL_COPY_MODULE)
    if not _ORIGINAL_SMALL_COPY:
        _ORIGINAL_SMALL_COPY.append(module.try_small_copy)
    recorder.declare_kernel(SMALL_COPY, _small_copy_accesses, cpu_impl=_small_copy_cpu,
                            name="small_copy (static inputs)")
