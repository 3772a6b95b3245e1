"""CudaDevice with the simulator's never-written memory, so racy runs can be compared exactly.

``torch.empty`` memory holds whatever was there; the simulator fills a block it has never
handed out with a fixed ``GARBAGE`` value (``sim.device.GARBAGE``, "fixed so runs compare").
A racy run that reads memory before it is written (a host read of a pinned buffer before its
D2H copy lands, a kernel reading a fresh buffer before its producer ran) then predicts
``GARBAGE``, which a GPU run could only match by chance. :class:`SentinelCudaDevice` writes
``GARBAGE`` into memory exactly where the simulator has it:

- every pinned buffer allocated without ``fill`` (the simulator never recycles pinned memory),
  on the host at allocation, before anything can use it;
- every device buffer without ``fill`` whose block is fresh in this run (CudaDevice gives a
  reused block its old storage id, and the simulator keeps a reused block's old contents),
  by a fill on its allocation stream, ordered before that stream's later work. When that
  stream is idle the host also waits for the fill (microseconds), so a first use on another
  stream cannot overtake it; behind a busy stream it does not wait, which would change the
  timing under test.

These fills are out of band: the happens-before trace does not see them, as the simulator's
initial contents are not accesses either. This is the one place that imports both ``sim``
(for the value) and ``gpu_check``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gpu_check.device import CudaDevice
from gpu_check.staging import intended_sync
from model.device import Buffer, Stream
from sim.device import GARBAGE


class SentinelCudaDevice(CudaDevice):
    """CudaDevice whose never-written memory holds ``GARBAGE`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._seen: set[int] = set()
        self.sentinel_fills = 0

    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, pinned: bool = False,
               fill: float | int | None = None, stream: Stream | None = None) -> Buffer:
        buf = super().buffer(name, shape, dtype, pinned=pinned, fill=fill, stream=stream)
        fresh = buf.storage not in self._seen
        self._seen.add(buf.storage)
        if fill is None and (pinned or fresh):
            self._poison(buf, stream)
        return buf

    def _poison(self, buf: Buffer, stream: Stream | None) -> None:
        t = self.tensor(buf)
        self.sentinel_fills += 1
        if buf.pinned:
            t.fill_(GARBAGE)
            return
        cs = self.cuda_stream(stream) if stream is not None else torch.cuda.current_stream()
        idle = cs.query()
        with torch.cuda.stream(cs):
            t.fill_(GARBAGE)
        if idle:
            with intended_sync():
                cs.synchronize()
