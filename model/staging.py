"""Host-known ints into an op's device: the one device hook op functions use (device API).

Op functions (device code, run inside ``Device.launch``) sometimes need a host-known index
list on their tensors' device. A device that runs op functions at issue time on real streams
(``gpu_check.CudaDevice``) cannot let them call ``torch.tensor(list, device="cuda")``: that
blocks the host until the op's stream is idle, so every op would read its inputs at issue
time, not when it runs. Such a device installs its own asynchronous copy with
:func:`staging` around each op function; :func:`host_ints` then uses it. A device that does
not (the simulator, whose tensors live on the CPU) needs nothing.

This lives beside ``model.device`` because it is part of what a device offers op functions:
the protocol calls :func:`host_ints` without knowing which device runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch

Stage = Callable[[torch.Tensor], torch.Tensor]
"""A device's copy of a CPU int64 tensor onto the current op's device, without a host sync."""

_STAGE: ContextVar[Stage | None] = ContextVar("device_staging", default=None)


@contextmanager
def staging(stage: Stage) -> Iterator[None]:
    """While active, :func:`host_ints` hands its CPU tensor to ``stage`` (which returns a
    device copy the current stream may use) instead of copying it with a host sync."""
    token = _STAGE.set(stage)
    try:
        yield
    finally:
        _STAGE.reset(token)


def host_ints(values: Sequence[int] | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host-known ints (a list, or a CPU int64 tensor) as an int64 tensor on ``device``.

    On a CPU device, a plain tensor. On another device, through the active :func:`staging`
    hook when there is one (no host sync), else by a plain (synchronizing) copy.
    """
    t = values if isinstance(values, torch.Tensor) else torch.tensor(
        values, dtype=torch.int64, device="cpu")
    if torch.device(device).type == t.device.type:
        return t
    stage = _STAGE.get()
    return t.to(device) if stage is None else stage(t)
