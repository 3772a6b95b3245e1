"""The semantics traces on real CUDA streams (CudaDevice), and the _sleep calibration.

Skipped without a CUDA device. Each trace's expectation was checked on SimDevice by
test_pure.py; here the same program on a GPU must give the same race kinds from the detector
over the measured trace, the values the forced interleaving predicts, and a manifest flag that
agrees with those values.
"""

from __future__ import annotations

import pytest
import torch

from overlap_harness.gpu_check.calibration import Calibration, calibrate, time_sleep_us
from overlap_harness.gpu_check.traces import FAST_US, TRACES, by_name, run_trace, warm_up
from overlap_harness.model.trace import OpKind

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def cal() -> Calibration:
    """The _sleep rate, measured once; every trace then runs once unmeasured (lazy module
    loading at a kernel's first launch can serialize the GPU: see traces.warm_up)."""
    from overlap_harness.gpu_check.cuda_device import CudaDevice

    c = calibrate()
    warm_up(lambda t: CudaDevice(delays=t.delays, calibration=c))
    return c


def cuda_run(name: str, cal: Calibration, torch_allocator: bool = False):
    from overlap_harness.gpu_check.cuda_device import CudaDevice

    trace = by_name(name)
    return run_trace(trace, CudaDevice(delays=trace.delays, calibration=cal,
                                       torch_allocator=torch_allocator))


@pytest.mark.parametrize("us", [100.0, 1000.0, 5000.0])
def test_sleep_of_x_us_measures_x_within_20_percent(cal: Calibration, us: float) -> None:
    time_sleep_us(cal.cycles(20_000))  # the SM clock may have dropped while idle
    measured = sorted(time_sleep_us(cal.cycles(us)) for _ in range(3))[1]
    assert measured == pytest.approx(us, rel=0.2), (cal, measured)


@pytest.mark.parametrize("trace", TRACES, ids=lambda t: t.name)
def test_trace_on_cuda_matches_the_expectation(trace, cal: Calibration) -> None:
    out = cuda_run(trace.name, cal)
    assert out.kinds == trace.expect, "\n".join(r.describe() for r in out.run.races)
    assert out.manifest == out.values_differ, out.values


def test_disjoint_rows_are_race_free_and_both_writes_land(cal: Calibration) -> None:
    out = cuda_run("disjoint_rows", cal)
    assert out.run.races == [] and out.values == out.trace.ordered


def test_host_read_before_a_delayed_d2h_sees_the_old_value(cal: Calibration) -> None:
    early, synced = cuda_run("pinned_early_read", cal), cuda_run("pinned_event_sync", cal)
    assert early.values["pin"] == [0, 0, 0, 0] and synced.values["pin"] == [7, 7, 7, 7]
    (race,) = early.run.races
    assert race.manifest is True and race.second.agent == "host"


def test_wait_binds_to_the_record_current_at_issue(cal: Calibration) -> None:
    out = cuda_run("rerecord_after_wait", cal)
    assert out.values["r"] == [1, 0]  # saw w0, not w1
    (race,) = out.run.races
    assert race.first.op_name == "w1" and race.elements == (1,)


def test_never_recorded_wait_does_not_hold_the_reader_back(cal: Calibration) -> None:
    out = cuda_run("never_recorded_wait", cal)
    t = {r.name: r for r in out.run.timeline}
    assert out.values["r"] == [0] and t["r"].start_ns < t["w"].end_ns


@pytest.mark.parametrize("torch_allocator", [False, True], ids=["block_pool", "torch"])
def test_allocator_reuse_without_record_stream_gives_the_new_owners_value(
        cal, torch_allocator: bool) -> None:
    bad = cuda_run("reuse_no_record_stream", cal, torch_allocator)
    good = cuda_run("reuse_record_stream", cal, torch_allocator)
    assert bad.values["gather"] == [9, 9, 9, 9] and good.values["gather"] == [1, 1, 1, 1]
    (race,) = bad.run.races
    assert race.buffer == "future_indices" and race.reused_as == "next_indices"
    assert race.manifest is True


def test_measured_timeline_is_causal(cal: Calibration) -> None:
    out = cuda_run("raw_record_wait", cal)
    tl = {t.name: t for t in out.run.timeline}
    assert all(t.start_ns <= t.end_ns for t in out.run.timeline)
    assert tl["r"].start_ns >= tl["w"].end_ns  # the wait held the reader back
    w = tl["w"]
    assert w.kind == OpKind.KERNEL and w.end_ns - w.start_ns >= 0.8 * 2000 * 1000
    r = tl["r"]
    assert r.end_ns - r.start_ns >= 0.5 * FAST_US * 1000
