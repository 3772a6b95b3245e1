"""The kernels on TokenSpeed's driven path, declared: what each reads and writes, and the
same values computed with torch ops (CPU mode runs no Triton, no CUDA extension).

From TokenSpeed's tree (its own Triton kernels; the Python wrappers that launch them stay
TokenSpeed's): ``fused_decode_input_prep_kernel`` (``execution/cache_loc_kernel.py``: each
program reads its request's slot and that slot's valid cache length, writes the request's
positions and sequence length) and ``compute_position_kernel``
(``execution/forward_batch_info.py``: positions and start offsets of an extend batch from its
prefix and extend lengths).

From the kernel package ``tokenspeed_kernel`` (not installable beside this torch):
``advance_accepted_frontier`` (each live request's slot advances its valid cache length by its
accepted tokens) and the prep tape (``PrepTape``: recorded tail fills of the persistent input
buffers, replayed by one launch after an H2D upload of the step's registers). The prep tape's
upload is modelled as kernel 0.1.4 does it (``PrepTape.run``: a pinned staging block
allocated per call, then the non-blocking copy), because that upload is part of the ordering
the loop must keep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from overlap_harness.recorder import declared, reads, writes
from overlap_harness.recorder.patching import patched
from overlap_harness.recorder.sites import not_user_code

not_user_code(__file__)  # a race names TokenSpeed's line that launched the kernel


def host_values(t: torch.Tensor) -> list:
    """A declared kernel's own read of device values, as a list: copied with ``.to("cpu")``,
    which inside the declared call is quiet (no host synchronization the kernel does not
    make; the recorder keeps ``tolist()``, ``int()`` and ``torch.tensor(..., device=...)``
    quiet there too, tests/recorder/test_declared_kernel_host_reads.py)."""
    return t.to("cpu").tolist()


def _frontier_values(req_pool_indices: torch.Tensor, input_lengths: torch.Tensor,
                     accept_lengths: torch.Tensor, valid_cache_lengths: torch.Tensor,
                     num_extends: int, padding_index: int, **_: Any) -> None:
    inputs, accepted = host_values(input_lengths), host_values(accept_lengths)
    for row, slot in enumerate(host_values(req_pool_indices)):
        if slot == padding_index:
            continue
        valid_cache_lengths[slot] += inputs[row] if row < num_extends else accepted[row]


def _frontier_accesses(_result: Any, req_pool_indices: torch.Tensor,
                       input_lengths: torch.Tensor, accept_lengths: torch.Tensor,
                       valid_cache_lengths: torch.Tensor, num_extends: int,
                       padding_index: int, **_: Any) -> list:
    live = req_pool_indices[req_pool_indices != padding_index]
    return (reads(req_pool_indices) + reads(input_lengths) + reads(accept_lengths)
            + reads(valid_cache_lengths, rows=live) + writes(valid_cache_lengths, rows=live))


_declared_frontier = declared(_frontier_accesses, cpu_impl=_frontier_values,
                              name="advance_accepted_frontier")(_frontier_values)


def advance_accepted_frontier(req_pool_indices: torch.Tensor, input_lengths: torch.Tensor,
                              accept_lengths: torch.Tensor, valid_cache_lengths: torch.Tensor,
                              num_extends: int, padding_index: int, *,
                              ngram_tail: torch.Tensor | None,
                              ngram_previous_tokens: torch.Tensor | None,
                              ngram_token_mask: torch.Tensor | None,
                              input_ids: torch.Tensor | None) -> None:
    """``tokenspeed_kernel.ops.metadata.advance_accepted_frontier`` without n-gram history
    (the driven model keeps none: asked for it, the stand-in refuses)."""
    if ngram_tail is not None:
        raise NotImplementedError("advance_accepted_frontier: n-gram history not declared")
    _declared_frontier(req_pool_indices, input_lengths, accept_lengths, valid_cache_lengths,
                       num_extends, padding_index)


def _tail_fill_values(regs_dev: torch.Tensor, rows: list[tuple[torch.Tensor, int, int, int]]
                      ) -> None:
    regs = host_values(regs_dev)
    for dst, live_reg, total, value in rows:
        dst[regs[live_reg]:total] = value


def _tail_fill_accesses(_result: Any, regs_dev: torch.Tensor,
                        rows: list[tuple[torch.Tensor, int, int, int]]) -> list:
    accesses = reads(regs_dev)
    for dst, *_ in rows:
        accesses += writes(dst)
    return accesses


_declared_tape = declared(_tail_fill_accesses, cpu_impl=_tail_fill_values,
                          name="run_tape")(_tail_fill_values)


class PrepTapeStandIn:
    """``tokenspeed_kernel.ops.metadata.PrepTape`` as TokenSpeed's input buffers use it:
    ``filltail`` rows recorded, ``finalize``, then per step ``run(regs)``: the registers
    written into a pinned block allocated for this call, copied to the device
    non-blocking, and one launch filling each recorded tail from its live count on."""

    def __init__(self, device: Any) -> None:
        self._device = torch.device(device)
        self._rows: list[tuple[torch.Tensor, int, int, int]] = []
        self._finalized = False
        self._regs_dev = torch.zeros(32, dtype=torch.int64, device=self._device)
        self._regs_host = torch.zeros(32, dtype=torch.int64)

    def filltail(self, dst: torch.Tensor, live: int, total: int, value: int) -> None:
        """``dst[live:total] = value`` at each run; ``live`` is a register slot."""
        if self._finalized:
            raise RuntimeError("tape already finalized")
        self._rows.append((dst, int(live), int(total), int(value)))

    def finalize(self) -> int:
        """The tape becomes immutable; returns how many operations it holds."""
        self._finalized = True
        return len(self._rows)

    def run(self, regs: dict) -> None:
        """This step's registers uploaded through a fresh pinned block, then the fills."""
        if not self._finalized:
            raise RuntimeError("finalize() the tape before run()")
        for slot, value in regs.items():
            self._regs_host[int(slot)] = int(value)
        staging = torch.empty(32, dtype=torch.int64, pin_memory=True)
        staging.copy_(self._regs_host)
        self._regs_dev.copy_(staging, non_blocking=True)
        _declared_tape(self._regs_dev, self._rows)


# -- TokenSpeed's own Triton kernels ------------------------------------------------------------

def _decode_prep_values(req_pool_indices: torch.Tensor, valid_cache_lengths: torch.Tensor,
                        positions: torch.Tensor, seq_lens: torch.Tensor, width: int) -> None:
    lengths = host_values(valid_cache_lengths)
    for row, slot in enumerate(host_values(req_pool_indices)):
        start = lengths[slot]
        seq_lens[row] = start + width
        positions[row * width:(row + 1) * width] = torch.arange(start, start + width)


def _decode_prep_accesses(_result: Any, req_pool_indices: torch.Tensor,
                          valid_cache_lengths: torch.Tensor, positions: torch.Tensor,
                          seq_lens: torch.Tensor, width: int) -> list:
    return (reads(req_pool_indices) + reads(valid_cache_lengths, rows=req_pool_indices)
            + writes(positions) + writes(seq_lens))


_declared_decode_prep = declared(_decode_prep_accesses, cpu_impl=_decode_prep_values,
                                 name="fused_decode_input_prep_kernel")(_decode_prep_values)


def _positions_values(positions: torch.Tensor, start_loc: torch.Tensor,
                      prefix_lens: torch.Tensor, seq_lens: torch.Tensor,
                      has_prefix: bool) -> None:
    offset = 0
    prefixes, lengths = host_values(prefix_lens), host_values(seq_lens)
    for row, length in enumerate(lengths):
        first = prefixes[row] if has_prefix else 0
        start_loc[row] = offset
        positions[offset:offset + length] = torch.arange(first, first + length)
        offset += length


def _positions_accesses(_result: Any, positions: torch.Tensor, start_loc: torch.Tensor,
                        prefix_lens: torch.Tensor, seq_lens: torch.Tensor,
                        has_prefix: bool) -> list:
    return (reads(prefix_lens) + reads(seq_lens) + writes(positions) + writes(start_loc))


_declared_positions = declared(_positions_accesses, cpu_impl=_positions_values,
                               name="compute_position_kernel")(_positions_values)


class _Grid:
    """``kernel[grid](...)``: the launch handed to a declared call."""

    def __init__(self, launch: Callable[..., None]) -> None:
        self._launch = launch

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
        return self._launch


def _decode_prep_launch(req_pool_indices: torch.Tensor, valid_cache_lengths: torch.Tensor,
                        positions: torch.Tensor, seq_lens: torch.Tensor, width: int, *,
                        BLOCK_SIZE: int) -> None:
    _declared_decode_prep(req_pool_indices, valid_cache_lengths, positions, seq_lens, width)


def _positions_launch(positions: torch.Tensor, start_loc: torch.Tensor,
                      prefix_lens: torch.Tensor, seq_lens: torch.Tensor,
                      has_prefix: bool) -> None:
    _declared_positions(positions, start_loc, prefix_lens, seq_lens, has_prefix)


@contextmanager
def tokenspeed_kernels_declared() -> Iterator[None]:
    """Inside: TokenSpeed's own Triton kernels on the path are the declared launches."""
    from tokenspeed.runtime.execution import cache_loc_kernel, forward_batch_info

    with patched([(cache_loc_kernel, "fused_decode_input_prep_kernel",
                   _Grid(_decode_prep_launch)),
                  (forward_batch_info, "compute_position_kernel", _Grid(_positions_launch))]):
        yield
