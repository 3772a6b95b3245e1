"""Does a ``non_blocking=True`` copy between pageable host memory and the device hold the host
until the stream's earlier work is done? Measured on the GPU, one line of JSON per case.

STREAM-SEMANTICS.md says such a copy is synchronous for the host "where it matters" (the
source read or staged, the destination landed) but not whether the host also waits for the
work queued before it on the stream. The GPU table's probe met the question in SGLang's loop
(an H2D of a pageable CPU tensor on the schedule stream, chained to the forward stream by the
WAR barrier, between two sides of a race the CPU mode reports). Each case queues
``torch.cuda._sleep(CYCLES)`` on a stream (directly, or on another stream it waits on), then
times the host across one copy on it; ``host_waited`` when that time is most of the sleep.
Usage: ``python tools/gpu_pageable_copy_sync.py`` on a CUDA host.
"""

from __future__ import annotations

import json
import time

import torch

CYCLES = 1 << 27  # about 70 ms on a Hopper SM clock


def _sleep_seconds() -> float:
    """The sleep's own length on this device (host time across sleep + synchronize)."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    torch.cuda._sleep(CYCLES)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def _case(direction: str, pinned: bool, elements: int, chained: bool) -> dict:
    stream, other = torch.cuda.Stream(), torch.cuda.Stream()
    host = torch.ones(elements, pin_memory=pinned)
    device = torch.ones(elements, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(other if chained else stream):
        torch.cuda._sleep(CYCLES)
    if chained:
        stream.wait_stream(other)  # the WAR barrier's shape: the stream waits on another
    with torch.cuda.stream(stream):
        started = time.perf_counter()
        if direction == "H2D":
            device.copy_(host, non_blocking=True)
        else:
            host.copy_(device, non_blocking=True)
        held = time.perf_counter() - started
    torch.cuda.synchronize()
    return {"direction": direction, "host_memory": "pinned" if pinned else "pageable",
            "bytes": elements * 4, "chained_through_wait_stream": chained,
            "host_seconds_in_copy": round(held, 5)}


def main() -> None:
    """Every case, as JSON lines, then a summary line."""
    torch.cuda.init()
    _case("H2D", False, 1, False)  # warm-up
    sleep = _sleep_seconds()
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "sleep_seconds": round(sleep, 5)}))
    for direction in ("H2D", "D2H"):
        for pinned in (False, True):
            for elements in (2, 1024, 16384, 262144, 4194304):
                for chained in (False, True):
                    row = _case(direction, pinned, elements, chained)
                    row["host_waited"] = row["host_seconds_in_copy"] > 0.5 * sleep
                    print(json.dumps(row))


if __name__ == "__main__":
    main()
