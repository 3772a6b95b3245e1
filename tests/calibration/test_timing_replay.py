"""The timing replay without a GPU: the op list captured from the simulator, its binding to
torch.cuda calls (against a fake api that logs them), the profiler trace read back onto the
host clock, the measured timeline's metrics, and the timing group's samples.

Expected figures are worked out by hand in each test, not by the code under test.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from overlap_harness.gpu_check.timing_replay import (
    aligned_spans,
    bind_calls,
    clock_offset,
    issue,
    trace_records,
)
from overlap_harness.model.metrics import compute_metrics
from overlap_harness.model.op_list import (
    ReplayCall,
    gpu_counts,
    gpu_streams,
    measured_timeline,
    replays_from_data,
    replays_to_data,
    timing_costs,
)
from overlap_harness.model.trace import HOST, OpKind
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_paths
from overlap_harness.sim.op_capture import CaptureSimDevice, capture_op_list


class _Handle:
    """A fake stream, event or tensor: every method call is logged as (name, method, args)."""

    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def __getattr__(self, method: str):
        def call(*args, **kwargs):
            self.log.append((self.name, method, tuple(getattr(a, "name", a) for a in args),
                             kwargs))
            return True
        return call


class FakeApi:
    """What bind_calls needs, logging instead of touching a GPU; the clock ticks 1 µs a read."""

    def __init__(self) -> None:
        self.log: list = []
        self.made: list[str] = []
        self.now = 0

    def clock(self) -> int:
        self.now += 1000
        return self.now

    def _make(self, kind: str) -> _Handle:
        name = f"{kind}{len(self.made)}"
        self.made.append(name)
        return _Handle(self.log, name)

    def stream(self):
        return self._make("stream")

    def event(self):
        return self._make("event")

    def device_bytes(self, nbytes: int):
        return self._make(f"dev{nbytes}_")

    def pinned_bytes(self, nbytes: int):
        return self._make(f"pin{nbytes}_")

    def set_stream(self, stream) -> None:
        self.log.append(("set_stream", stream.name))

    def sleep(self, cycles: int) -> None:
        self.log.append(("sleep", cycles))

    def synchronize(self) -> None:
        self.log.append(("device_sync",))


def test_bind_issues_each_call_as_its_raw_torch_cuda_call():
    calls = [
        ReplayCall("kernel", "k", stream="F", cost_us=10.0),
        ReplayCall("copy", "c", stream="F", nbytes=64, direction="d2h"),
        ReplayCall("record", "record:e", stream="F", event="e#0"),
        ReplayCall("wait_event", "wait:e", stream="S", event="e#0"),
        ReplayCall("wait_stream", "wait:F", stream="S", other="F"),
        ReplayCall("synchronize", "sync:S", stream="S", other="stream"),
        ReplayCall("synchronize", "sync:e", other="event", event="e#0"),
        ReplayCall("synchronize", "sync:device", other="device"),
        ReplayCall("copy", "b", stream="S", nbytes=8, direction="h2d", blocking=True),
        ReplayCall("host_work", "prep", cost_us=3.0),
    ]
    api = FakeApi()
    bound = bind_calls(calls, api, cycles_per_us=100.0)
    assert list(bound.streams) == ["F", "S"]
    made = list(api.made)
    stamps = issue(bound.program, api.clock)
    f, s = "stream0", "stream1"
    event = next(m for m in made if m.startswith("event"))
    d2h_dst = next(m for m in made if m.startswith("pin64_"))
    h2d_dst = next(m for m in made if m.startswith("dev8_"))
    assert api.log == [
        ("set_stream", f), ("sleep", 1000),
        ("set_stream", f), (d2h_dst, "copy_", (made[made.index(d2h_dst) - 1],),
                            {"non_blocking": True}),
        (event, "record", (f,), {}),
        (s, "wait_event", (event,), {}),
        (s, "wait_stream", (f,), {}),
        (s, "synchronize", (), {}),
        (event, "synchronize", (), {}),
        ("device_sync",),
        ("set_stream", s), (h2d_dst, "copy_", (made[made.index(h2d_dst) - 1],),
                            {"non_blocking": False}),
    ]
    # one stamp before and one after each call; the host work spins the clock >= 3 µs
    assert len(stamps) == len(calls) + 1
    assert stamps[-1] - stamps[-2] >= 3000


def test_capture_takes_the_programs_calls_and_skips_removed_syncs():
    spec = next(s for sc in load_paths(["scenarios"]) for s in expand(sc)
                if s.removed and s.expect == "race")
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    calls, timeline = capture_op_list(scenario, spec.removed)
    labels = {c.label for c in calls}
    assert not labels & set(spec.removed)
    gpu = [c for c in calls if c.on_gpu]
    ops = [r for r in timeline if r.kind in (OpKind.KERNEL, OpKind.COPY)]
    assert [(c.name, c.stream, c.iteration) for c in gpu] == \
        [(r.name, r.agent, r.iteration) for r in ops]
    # durations of the simulated twin are the costs captured
    assert [round(c.cost_us * 1000) for c in gpu] == [r.end_ns - r.start_ns for r in ops]


def test_capture_records_copy_size_direction_and_blocking():
    dev = CaptureSimDevice()
    f = dev.stream("F")
    src = dev.buffer("src", (4,), torch.int64, fill=1, stream=f)
    pinned = dev.buffer("dst", (4,), torch.int64, pinned=True)
    dev.copy(f, (src, slice(0, 2)), (pinned, slice(0, 2)), non_blocking=False, cost_us=5.0)
    dev.copy(f, pinned, src, non_blocking=True)
    copies = [c for c in dev.calls if c.kind == "copy"]
    assert [(c.direction, c.nbytes, c.blocking) for c in copies] == \
        [("d2h", 16, True), ("h2d", 32, False)]


def _trace(records, streams_ids, runtime_offset=0):
    """A Chrome trace: markers, then GPU records (stream id, ts µs, dur µs, correlation) and
    each one's runtime record at ``runtime_offset`` µs on the trace clock."""
    events = []
    for index, sid in enumerate(streams_ids):
        events.append({"cat": "kernel", "name": "marker", "ts": index * 1.0, "dur": 0.5,
                       "args": {"stream": sid, "correlation": 900 + index}})
    for sid, ts, dur, corr, rt in records:
        events.append({"cat": "kernel", "name": "spin", "ts": ts, "dur": dur,
                       "args": {"stream": sid, "correlation": corr}})
        events.append({"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": rt,
                       "dur": 2.0, "args": {"correlation": corr}})
    return {"traceEvents": events}


def test_trace_records_split_by_stream_and_replay_and_align_to_the_host_clock():
    calls = [ReplayCall("kernel", "a", stream="F", cost_us=5.0),
             ReplayCall("kernel", "b", stream="S", cost_us=5.0)]
    # trace clock = host clock + 1000 µs; replay 0 calls at host 10-14 and 14-18 µs, their
    # runtime records at 1011-1013 and 1015-1017; replay 1 100 µs later
    recs = [(7, 1020.0, 5.0, 1, 1011.0), (8, 1016.0, 5.0, 2, 1015.0),
            (7, 1120.0, 5.0, 3, 1111.0), (8, 1116.0, 5.0, 4, 1115.0)]
    trace = _trace(recs, [7, 8])
    per_rep = trace_records(trace, gpu_streams(calls), gpu_counts(calls), 2)
    assert [r["F"][0][:2] for r in per_rep] == [(1_020_000, 1_025_000), (1_120_000, 1_125_000)]
    stamps = [10_000, 14_000, 18_000]
    # bounds: low = max(1013-14, 1017-18) = 999 µs, high = min(1011-10, 1015-14) = 1001 µs
    assert clock_offset(calls, stamps, per_rep[0]) == 1_000_000
    assert aligned_spans(calls, stamps, per_rep[0]) == {"F": [(20_000, 25_000)],
                                                        "S": [(16_000, 21_000)]}
    with pytest.raises(ValueError, match="expected 4"):
        trace_records(trace, ["F", "S"], {"F": 2, "S": 1}, 2)


def _program():
    """Two iterations: host work, a forward kernel, a D2H copy on it, a host sync of it."""
    calls = []
    for it in (0, 1):
        calls += [ReplayCall("host_work", "prep", cost_us=10.0, iteration=it),
                  ReplayCall("kernel", "fwd", stream="forward", cost_us=100.0, iteration=it),
                  ReplayCall("copy", "d2h", stream="forward", nbytes=16, direction="d2h",
                             iteration=it),
                  ReplayCall("synchronize", "sync:forward", stream="forward", other="stream",
                             label="d2h.host_sync", iteration=it)]
    return calls


def test_measured_timeline_gives_the_simulators_metrics():
    calls = _program()
    # host: work 0-11, launch 11-16, copy 16-20, sync 20-130 | work 130-141, launch 141-146,
    # copy 146-150, sync 150-265 (µs)
    stamps = [t * 1000 for t in (0, 11, 16, 20, 130, 141, 146, 150, 265)]
    spans = {"forward": [(18_000, 120_000), (122_000, 126_000), (150_000, 255_000),
                   (258_000, 262_000)]}
    timeline = measured_timeline(calls, stamps, spans)
    syncs = [r for r in timeline if r.kind == OpKind.HOST_SYNC]
    assert [(r.start_ns, r.end_ns, r.agent) for r in syncs] == \
        [(20_000, 130_000, HOST), (150_000, 265_000, HOST)]
    m = compute_metrics(timeline)
    assert m.host_stall_ns == 110_000 + 115_000
    assert m.forward_idle_ns == 2_000 + 24_000 + 3_000  # 120-122, 126-150, 255-258
    assert m.iteration_ns == 150_000 - 18_000
    with pytest.raises(ValueError, match="do not match"):
        measured_timeline(calls, stamps, {"forward": spans["forward"][:3]})


def test_timing_costs_reads_call_times_sync_wait_and_gpu_gaps():
    calls = _program()
    stamps = [t * 1000 for t in (0, 11, 16, 20, 130, 141, 146, 150, 265)]
    spans = {"forward": [(18_000, 120_000), (122_000, 126_000), (150_000, 255_000),
                   (258_000, 262_000)]}
    s = timing_costs([(calls, stamps, spans)])
    assert s.call_us["kernel"] == [5.0, 5.0]
    assert s.call_us["copy_d2h"] == [4.0, 4.0]
    assert s.call_us["host_work"] == [1.0, 1.0]  # 11 µs for a 10 µs cost
    assert s.kernel_extra_us["kernel:fwd"] == [2.0, 5.0]
    assert s.copy_us["d2h"] == [4.0, 4.0]
    assert s.sync_idle_us == [] and s.sync_wake_us == [4.0, 3.0]  # 130-126, 265-262
    # the copies were queued behind the kernels: 2 and 3 µs; the kernels found F idle
    assert s.start_gap_us == [2.0, 3.0]
    assert s.start_lag_us == [2.0, 4.0]  # 18 - 16, 150 - 146


def test_saved_replays_read_back():
    calls = _program()
    replay = (calls, [1, 2, 3, 4, 5, 6, 7, 8, 9], {"forward": [(1, 2), (3, 4), (5, 6), (7, 8)]})
    back = replays_from_data(replays_to_data([("run/a", [replay])]))
    assert back == [("run/a", [replay])]
