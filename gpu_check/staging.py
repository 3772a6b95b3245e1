"""Host values to the GPU without a hidden sync or a copy stuck behind a forced delay.

The protocol's op functions return host tensors (``lambda: vals``) and its selections are
index lists; both must reach the GPU inside the op. The obvious ways break forced delays:
``torch.as_tensor(x, device="cuda")`` synchronizes the current stream (the host waits out the
sleep), ``pin_memory()`` may call ``cudaHostAlloc``, which can wait for the device, and an
H2D copy enqueued on the op's stream behind its cost sleep was seen on an H200 to hold back a
copy on another stream (a false order that hid the race the delay was meant to show).

So :class:`Stager` copies through one pinned arena allocated up front, on its own stream that
never waits for anything, at issue time; the op's stream then waits for that copy only (an
event), and the device tensor is marked as used by that stream so the allocator keeps it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

ALIGN = 64


@contextmanager
def intended_sync() -> Iterator[None]:
    """Mark a host sync the program means (a protocol sync, a ring wrap): PyTorch's sync
    debug mode (``torch.cuda.set_sync_debug_mode``) is off inside, so an audit run under it
    (:mod:`overlap_harness.replay.sync_audit`) reports only the syncs nobody asked for."""
    mode = torch.cuda.get_sync_debug_mode()
    if mode == 0:
        yield
        return
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(mode)


def prewarm(stream: torch.cuda.Stream) -> None:
    """Give ``stream`` a cached small-block segment now, while nothing races: a ``cudaMalloc``
    in the middle of a forced interleaving was seen to hold the host until the GPU went idle."""
    with torch.cuda.stream(stream):
        del_me = torch.empty(1, dtype=torch.uint8, device="cuda")
    del del_me  # freed to the stream's pool; later small allocations carve the same segment


class Stager:
    """Stages small host tensors to the device at issue time (see the module docstring).

    Args:
        arena_bytes: size of the pinned arena; it is reused as a ring, and the staging stream
            is synchronized (it only ever holds tiny copies) before a slot is overwritten.
    """

    def __init__(self, arena_bytes: int = 16 << 20) -> None:
        self.stream = torch.cuda.Stream()
        prewarm(self.stream)
        self.arena = torch.empty(arena_bytes, dtype=torch.uint8, pin_memory=True)
        self.pos = 0

    def _slot(self, nbytes: int) -> torch.Tensor | None:
        size = -(-max(nbytes, 1) // ALIGN) * ALIGN
        if size > self.arena.numel():
            return None
        if self.pos + size > self.arena.numel():
            with intended_sync():  # earlier copies out of the ring have all run
                self.stream.synchronize()
            self.pos = 0
        slot = self.arena[self.pos : self.pos + nbytes]
        self.pos += size
        return slot

    def to_device(self, value: torch.Tensor, consumer: torch.cuda.Stream) -> torch.Tensor:
        """A device copy of host tensor ``value`` that ``consumer``'s later work may use."""
        value = value.contiguous()
        nbytes = value.numel() * value.element_size()
        slot = self._slot(nbytes)
        if slot is None:  # larger than the arena: pin it on its own
            host = value.pin_memory()
        else:
            host = slot.view(value.dtype).reshape(value.shape) if nbytes else value
            host.copy_(value)
        with torch.cuda.stream(self.stream):
            dev = torch.empty(value.shape, dtype=value.dtype, device="cuda")
            dev.copy_(host, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        consumer.wait_event(done)
        dev.record_stream(consumer)
        return dev
