"""vLLM's Triton kernels on the driven paths, declared: what each reads and writes, and the
same values computed with torch ops (CPU mode runs no Triton).

``_apply_write_kernel`` (Model Runner V2's ``StagedWriteTensor.apply_write``): program ``i``
reads ``indices[i]``, ``starts[i]`` and ``cu_lens[i-1:i+1]`` (pinned memory, through UVA
views), then ``contents[cu_start:cu_end]``, and writes them into row ``indices[i]`` of the
output from column ``starts[i]`` on. The declaration names the whole index arrays, the
contents and the written rows. The multi-group form (one kernel for several tensors, through
an array of row pointers) is not driven: asked for it, the stand-in refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from overlap_harness.recorder import declared, reads, writes
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names the vLLM line that launched the kernel, not this file


def _write_rows(output: torch.Tensor, indices: torch.Tensor, starts: torch.Tensor,
                contents: torch.Tensor, cu_lens: torch.Tensor, count: int) -> None:
    """The kernel's values: each staged write copied into its row."""
    begin = 0
    for i in range(count):
        row, start, end = int(indices[i]), int(starts[i]), int(cu_lens[i])
        output[row, start:start + end - begin] = contents[begin:end]
        begin = end


def _accesses(_result: Any, output: torch.Tensor, indices: torch.Tensor,
              starts: torch.Tensor, contents: torch.Tensor, cu_lens: torch.Tensor,
              count: int) -> list:
    return (reads(indices) + reads(starts) + reads(cu_lens) + reads(contents)
            + writes(output, rows=indices[:count]))


_declared_write = declared(_accesses, cpu_impl=_write_rows, name="_apply_write_kernel")(
    _write_rows)


class _GridLaunch:
    """``_apply_write_kernel[grid](...)`` with the single-group arguments."""

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(output: torch.Tensor, output_stride: Any, indices: torch.Tensor,
                   starts: torch.Tensor, contents: torch.Tensor, cu_lens: torch.Tensor,
                   group_ids: Any, *, BLOCK_SIZE: int, MULTI_GROUP: bool) -> None:
            if MULTI_GROUP or group_ids is not None:
                raise NotImplementedError("_apply_write_kernel: the multi-group form is not "
                                          "declared (not driven)")
            _declared_write(output, indices, starts, contents, cu_lens, grid[0])
        return launch


@contextmanager
def apply_write_kernel_declared(buffer_utils: Any) -> Iterator[None]:
    """Inside: ``buffer_utils._apply_write_kernel`` is the declared stand-in."""
    original = buffer_utils._apply_write_kernel
    buffer_utils._apply_write_kernel = _GridLaunch()
    try:
        yield
    finally:
        buffer_utils._apply_write_kernel = original
