"""CPU mode's device-generic stream API: ``torch.Event``, ``torch.Stream`` and
``torch.accelerator``'s stream calls, faked like their ``torch.cuda`` twins.

Engines written for several vendors (vLLM) mix ``torch.cuda.Event`` with the device-generic
``torch.Event()`` and ``torch.accelerator.synchronize()``; a fake that covered only
``torch.cuda`` would let those calls reach a CPU build of torch, where a ``torch.Event()``
records nothing and a ``synchronize`` orders nothing, so the protocol would be erased instead
of checked. Here each generic call is the same node of the recording as its CUDA twin
(:mod:`recorder.fake_streams`).
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.recorder.fake_streams import FakeEvent, FakeStream, state


class FakeGenericEvent(FakeEvent):
    """``torch.Event(device=None, *, enable_timing=False, blocking=False,
    interprocess=False)``: the CUDA event, with the generic constructor's leading ``device``."""

    def __init__(self, device: Any = None, *, enable_timing: bool = False,
                 blocking: bool = False, interprocess: bool = False) -> None:
        super().__init__(enable_timing=enable_timing, blocking=blocking,
                         interprocess=interprocess)


class FakeGenericStream(FakeStream):
    """``torch.Stream(device=None, *, priority=0)``: the CUDA stream under the generic name."""


def _accelerator_synchronize(device: Any = None) -> None:
    state().recording.sync_device()


def _accelerator_current_stream(device: Any = None) -> FakeStream:
    return state().current


def _accelerator_set_stream(stream: FakeStream) -> None:
    state().current = stream


def _no_op(name: str) -> Any:
    """A memory-statistics call: CPU mode has no device memory to report on."""
    def ignore(*args: Any, **kwargs: Any) -> None:
        return None
    ignore.__name__ = ignore.__qualname__ = name
    return ignore


def accelerator_patches() -> list[tuple[Any, str, Any]]:
    """``(object, attribute, replacement)`` for the device-generic names CPU mode fakes."""
    accelerator = torch.accelerator
    patches: list[tuple[Any, str, Any]] = [
        (torch, "Event", FakeGenericEvent),
        (torch, "Stream", FakeGenericStream),
        (accelerator, "synchronize", _accelerator_synchronize),
        (accelerator, "current_stream", _accelerator_current_stream),
        (accelerator, "set_stream", _accelerator_set_stream),
        (accelerator, "is_available", lambda: True),
        (accelerator, "device_count", lambda: 1),
        (accelerator, "current_device_index", lambda: 0),
        (accelerator, "current_accelerator", lambda check_available=False:
            torch.device("cuda", 0)),
        (accelerator, "set_device_index", lambda device: None),
    ]
    patches += [(accelerator, name, _no_op(name))
                for name in ("empty_cache", "reset_peak_memory_stats")
                if hasattr(accelerator, name)]
    return patches
