"""The pure logic of gpu_check, on CPU: calibration fit, time conversion and clock alignment,
trace recording replayed into the detector with a fake clock, the sanitizer verdict, and every
semantics trace's expectation checked on SimDevice (so a GPU mismatch means the GPU differs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from overlap_harness.gpu_check.calibration import CalibrationError, cycles_for, fit_cycles_per_us
from overlap_harness.gpu_check.cuda_device import CudaDevice, is_view_sel
from overlap_harness.gpu_check.sanitizer import (
    SanitizerVerdict,
    enabled_by_env,
    first_line,
    summarize,
)
from overlap_harness.gpu_check.trace_log import TraceRecorder, fit_shift, is_host_stamp, ms_to_ns
from overlap_harness.gpu_check.traces import TRACES, run_trace
from overlap_harness.model.detector import AccessReq
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.trace import OpKind
from overlap_harness.sim.sim_device import SimDevice


# -- calibration -----------------------------------------------------------------------------
def test_fit_recovers_rate_and_overhead_from_exact_samples() -> None:
    samples = [(n, 3.0 + n / 1755.0) for n in (20_000, 200_000, 2_000_000)]
    rate, overhead = fit_cycles_per_us(samples)
    assert rate == pytest.approx(1755.0) and overhead == pytest.approx(3.0)


def test_fit_rejects_one_point_and_a_flat_clock() -> None:
    with pytest.raises(CalibrationError, match="two distinct cycle counts"):
        fit_cycles_per_us([(1000, 1.0), (1000, 1.1)])
    with pytest.raises(CalibrationError, match="does not grow"):
        fit_cycles_per_us([(1000, 5.0), (2000, 5.0)])


def test_cycles_for_rounds_and_rejects_negative_time() -> None:
    assert cycles_for(2.5, 1000.4) == 2501 and cycles_for(0, 1500) == 0
    with pytest.raises(ValueError, match="negative duration -1"):
        cycles_for(-1, 1500)


# -- time conversion and alignment -----------------------------------------------------------
def test_ms_to_ns_is_integer_and_exact_at_event_resolution() -> None:
    assert ms_to_ns(0.0015) == 1500 and ms_to_ns(2.0) == 2_000_000
    assert isinstance(ms_to_ns(1e-4), int)


@pytest.mark.parametrize(("lo", "hi", "shift"), [
    (None, None, 0), (-50, 40, 0), (30, 100, 30), (-100, -20, -20), (10, 4, 7), (5, None, 5),
])
def test_fit_shift_moves_device_times_only_as_far_as_causality_needs(lo, hi, shift) -> None:
    assert fit_shift(lo, hi) == shift


def test_host_stamps_are_ints_and_bools_are_not() -> None:
    assert is_host_stamp(5) and not is_host_stamp(True) and not is_host_stamp(FakeEv(5))


# -- recorder + detector with a fake clock ---------------------------------------------------
@dataclass(eq=False)
class FakeEv:
    """A device timing handle whose time is known: the fake clock returns it."""

    t: int


def acc(elements: list[int], write: bool) -> AccessReq:
    return AccessReq(0, 0, "b", np.asarray(elements, dtype=np.int64), write)


def raw_trace(read_at: int, shift_ns: int = 0) -> TraceRecorder:
    """Writer on S ends at 100 µs; an unsynchronized reader on F starts at ``read_at``."""
    rec = TraceRecorder()
    s, f = rec.add_agent("schedule"), rec.add_agent("forward")
    rec.add_storage(0, 4, (4,))
    rec.add("w", s, OpKind.KERNEL, iteration=0, source="", issue=1_000,
            start=FakeEv(2_000 + shift_ns), work=FakeEv(90_000 + shift_ns),
            end=FakeEv(100_000 + shift_ns), accesses=[acc([0], True)])
    rec.add("r", f, OpKind.KERNEL, iteration=0, source="", issue=3_000,
            start=FakeEv(read_at + shift_ns), end=FakeEv(read_at + 1_000 + shift_ns),
            accesses=[acc([0], False)])
    return rec


@pytest.mark.parametrize(("read_at", "manifest"), [(4_000, True), (150_000, False)])
def test_recorder_replays_into_the_detector_with_resolved_times(read_at, manifest) -> None:
    run = raw_trace(read_at).finish(lambda ev: ev.t)
    (race,) = run.races
    assert str(race.kind) == "RAW" and race.manifest is manifest
    assert [(t.name, t.agent, t.issue_ns, t.start_ns, t.end_ns) for t in run.timeline] == [
        ("w", "schedule", 1_000, 2_000, 100_000),
        ("r", "forward", 3_000, read_at, read_at + 1_000)]
    assert run.end_ns == max(100_000, read_at + 1_000)


def test_a_device_clock_that_runs_early_is_shifted_to_start_after_issue() -> None:
    run = raw_trace(4_000, shift_ns=-2_500).finish(lambda ev: ev.t)
    w, r = run.timeline
    assert w.start_ns == w.issue_ns and r.start_ns == r.issue_ns  # the least shift: 1.5 µs


def test_recorded_wait_orders_and_host_sync_joins_are_replayed() -> None:
    rec = TraceRecorder()
    s, f = rec.add_agent("schedule"), rec.add_agent("forward")
    rec.add_storage(0, 4, (4,))
    rec.add("w", s, OpKind.KERNEL, iteration=0, source="", issue=0, start=FakeEv(200),
            end=FakeEv(500), accesses=[acc([0, 1], True)])
    mark = FakeEv(500)
    rec.add("record:e", s, OpKind.RECORD, iteration=0, source="", issue=20, start=mark,
            end=mark, event="e")
    assert rec.event_op("e") == 1 and rec.event_op("never") is None
    wait = FakeEv(500)
    rec.add("wait:e", f, OpKind.WAIT, iteration=0, source="", issue=30, start=wait, end=wait,
            event="e")
    rec.add("r", f, OpKind.KERNEL, iteration=0, source="", issue=40, start=FakeEv(510),
            end=FakeEv(520), accesses=[acc([0], False)])
    rec.add("sync", 0, OpKind.HOST_SYNC, iteration=0, source="", issue=50, start=50, end=400,
            joins=[rec.last_op(f)])
    rec.add("host_r", 0, OpKind.HOST_READ, iteration=0, source="", issue=401, start=401,
            end=401, accesses=[acc([1], False)])
    run = rec.finish(lambda ev: ev.t)
    assert run.races == []
    # the sync returned at 400 on the host clock, so the device clock is pulled back 120 ns
    assert run.timeline[3].end_ns == 400 and run.timeline[0].start_ns == 80


# -- sanitizer verdicts ----------------------------------------------------------------------
def test_sanitizer_env_flag_and_verdict() -> None:
    assert enabled_by_env({"TORCH_CUDA_SANITIZER": "1"})
    assert not enabled_by_env({}) and not enabled_by_env({"TORCH_CUDA_SANITIZER": "0"})
    assert SanitizerVerdict(True, ("x",)).verdict == "race"
    assert SanitizerVerdict(False).as_dict()["verdict"] == "race_free"
    assert SanitizerVerdict(False, failure="RuntimeError: x").verdict == "error"


def test_sanitizer_report_summaries() -> None:
    text = "============================\nCSAN detected a possible data race on tensor\n"
    assert first_line(text) == "CSAN detected a possible data race on tensor"

    @dataclass
    class A:
        operator: str
        stream: int
        type: str

    @dataclass
    class E:
        current_access: A
        previous_access: A

    err = E(A("aten::index_put_", 2, "writing to"), A("aten::index_put_", 1, "writing to"))
    assert summarize(err) == ("aten::index_put_ on stream 2 (writing to) unsynchronized with "
                              "aten::index_put_ on stream 1 (writing to)")


# -- device helpers that need no GPU ---------------------------------------------------------
def test_view_selections_are_the_ones_pinned_buffers_accept() -> None:
    assert is_view_sel(None) and is_view_sel(3) and is_view_sel((1, slice(0, 4)))
    assert not is_view_sel([0, 1]) and not is_view_sel(torch.tensor([0]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_device_says_it_needs_cuda() -> None:
    with pytest.raises(DeviceUsageError, match="needs a CUDA device"):
        CudaDevice()


# -- the traces' expectations hold on the simulator ------------------------------------------
@pytest.mark.parametrize("trace", TRACES, ids=lambda t: t.name)
def test_trace_expectation_holds_on_simdevice(trace) -> None:
    out = run_trace(trace, SimDevice(delays=trace.delays))
    assert out.kinds == trace.expect, "\n".join(r.describe() for r in out.run.races)
    assert out.manifest == out.values_differ, out.values
