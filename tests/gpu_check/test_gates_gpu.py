"""Gates on a real GPU: a flag-held op runs after the op the plan says, whatever the timing.

Skipped without a CUDA device. Two streams race on one buffer; the writer is issued first and
has a long cost, so by timing alone the reader runs first and sees the old value. A gate from
writer to reader makes the reader see the new value, and a gate the other way round (reader
first, from a host read too) holds the writer back. The trace still reports the race.
"""

from __future__ import annotations

import pytest
import torch

from overlap_harness.model.trace import HOST

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def race(gates=(), *, host_reader: bool = False):
    """W on stream a writes 7 after 20 ms of cost; R (stream b, or the host via a pinned
    copy) reads right away. Returns (value read, race kinds in the trace, gate stats)."""
    from overlap_harness.gpu_check.cuda_device import CudaDevice

    dev = CudaDevice(gates=gates)
    a, b = dev.stream("a"), dev.stream("b")
    buf = dev.buffer("x", (1,), torch.int64, fill=1)
    out = dev.buffer("y", (1,), torch.int64, fill=0)
    pinned = dev.buffer("y_cpu", (1,), torch.int64, pinned=True, fill=0)
    dev.synchronize(None)
    dev.launch(a, "W", lambda: torch.tensor([7]), writes=[buf], cost_us=20_000)
    if host_reader:
        dev.copy(a, buf, pinned, non_blocking=True, name="D2H")
        got = int(dev.host_read(pinned, None, name="R")[0])
    else:
        dev.launch(b, "R", lambda x: x.clone(), reads=[buf], writes=[out])
        dev.synchronize(None)
        got = int(dev.value(out)[0])
    run = dev.finish()
    return got, sorted({str(r.kind) for r in run.races}), dev.gate_stats


def test_without_a_gate_the_reader_overtakes_the_slow_writer() -> None:
    got, kinds, stats = race()
    assert got == 1 and kinds == ["RAW"] and stats is None


def test_a_gate_holds_the_reader_until_the_writer_ends_and_the_race_stays_in_the_trace() -> None:
    got, kinds, stats = race([(("a", "W", -1, 0), ("b", "R", -1, 0))])
    assert got == 7 and kinds == ["RAW"]
    assert stats is not None and stats.gates == 1 and stats.unset == 0 and not stats.timed_out


def test_a_host_read_gated_on_a_copy_waits_for_it_to_land() -> None:
    got, kinds, stats = race([(("a", "D2H", -1, 0), (HOST, "R", -1, 0))], host_reader=True)
    assert got == 7 and kinds, kinds
    assert stats is not None and stats.unset == 0 and not stats.timed_out


def test_a_gate_whose_setter_never_comes_is_released_and_counted() -> None:
    _got, _kinds, stats = race([(("a", "never", -1, 0), ("b", "R", -1, 0))])
    assert stats is not None and stats.unset == 1
    assert stats.timed_out  # the host's sync waited on the held stream until the watchdog
