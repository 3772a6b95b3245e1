"""CudaDevice with the simulator's never-written memory, so racy runs can be compared exactly.

``torch.empty`` memory holds whatever was there; the simulator fills a block it has never
handed out with a fixed ``GARBAGE`` value (``sim.sim_device.GARBAGE``, "fixed so runs compare").
A racy run that reads memory before it is written (a host read of a pinned buffer before its
D2H copy lands, a kernel reading a fresh buffer before its producer ran) then predicts
``GARBAGE``, which a GPU run could only match by chance. :class:`SentinelCudaDevice` writes
``GARBAGE`` into memory exactly where the simulator has it:

- every pinned buffer allocated without ``fill`` (the simulator never recycles pinned memory),
  on the host at allocation, before anything can use it;
- every device buffer without ``fill`` whose block is fresh in this run (a reused block keeps
  its old contents, in the simulator too). With the harness's block pool (the default), a
  fresh block comes from a stream no work of this run touches, so the fill runs there and the
  host waits for it (microseconds): it is in place before any stream can read the block, even
  a racy read on another stream that runs before the block's first write (the plan stream
  reading the gathered seq_lens early). With torch's allocator the block may be memory a
  torch temporary's pending work still uses, so the fill runs on its allocation stream,
  ordered after that work, and is waited for only when that stream is idle.

These fills are out of band: the happens-before trace does not see them, as the simulator's
initial contents are not accesses either. This is the one place that imports both ``sim``
(for the value) and ``gpu_check``.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.gpu_check.cuda_device import CudaDevice
from overlap_harness.gpu_check.staging import intended_sync
from overlap_harness.model.device import Stream
from overlap_harness.sim.sim_device import GARBAGE


class SentinelCudaDevice(CudaDevice):
    """CudaDevice whose never-written memory holds ``GARBAGE`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sentinel_fills = 0

    def _fresh_block(self, t: torch.Tensor, pinned: bool, stream: Stream | None) -> None:
        self.sentinel_fills += 1
        if pinned:
            t.fill_(GARBAGE)
            return
        if self._blocks is not None:
            cs = self._fresh_cs
        else:
            cs = self.cuda_stream(stream) if stream is not None else torch.cuda.current_stream()
        idle = cs.query()
        with torch.cuda.stream(cs):
            t.fill_(GARBAGE)
        if idle:
            with intended_sync():
                cs.synchronize()
