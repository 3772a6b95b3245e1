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
  by a fill that the host waits for (microseconds), so no stream can read the block before
  it holds ``GARBAGE``: a racy read on another stream that runs before the block's first
  write (the plan stream reading gathered seq_lens early) must see what the simulator
  predicts. The fill runs on its allocation stream when that stream is idle; behind a busy
  one (waiting would change the timing under test) it runs on a side stream, unless the
  block overlaps memory this run freed from that stream whose work may still be pending (the
  allocator's stream order is then the only thing keeping the old owner's accesses first),
  in which case it stays on the allocation stream, unwaited, as the old rule had it.

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
        self._side = torch.cuda.Stream()
        self._alloc_stream: dict[int, Stream | None] = {}
        self._freed: list[tuple[int, int, torch.cuda.Event]] = []  # start, end, done on stream

    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, pinned: bool = False,
               fill: float | int | None = None, stream: Stream | None = None) -> Buffer:
        buf = super().buffer(name, shape, dtype, pinned=pinned, fill=fill, stream=stream)
        self._alloc_stream[buf.id] = stream
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
        if not cs.query() and not self._overlaps_pending(t):
            cs = self._side
        idle = cs.query()
        with torch.cuda.stream(cs):
            t.fill_(GARBAGE)
        if idle:
            with intended_sync():
                cs.synchronize()

    def _overlaps_pending(self, t: torch.Tensor) -> bool:
        lo, hi = t.data_ptr(), t.data_ptr() + max(t.numel() * t.element_size(), 1)
        self._freed = [f for f in self._freed if not f[2].query()]
        return any(a < hi and lo < b for a, b, _ev in self._freed)

    def free(self, buf: Buffer) -> None:
        if not buf.pinned:
            t = self.tensor(buf)
            stream = self._alloc_stream.get(buf.id)
            cs = self.cuda_stream(stream) if stream is not None else torch.cuda.current_stream()
            ev = torch.cuda.Event()
            ev.record(cs)
            start = t.data_ptr()
            size = -(-max(t.numel() * t.element_size(), 1) // 512) * 512  # the allocator's rounding
            self._freed.append((start, start + size, ev))
        super().free(buf)
