"""The interleaved measurement without a GPU: the order of each round and the split of one
round's profiler trace into the replays of several op lists (the GPU records by start time,
each list's markers first). Expected values are worked out by hand in each test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlap_harness.gpu_check import timing_replay
from overlap_harness.gpu_check.timing_replay import (
    replay_rounds,
    round_order,
    segment_records,
)
from overlap_harness.model.op_list import ReplayCall, gpu_counts, gpu_streams
from overlap_harness.timing_check import (
    fit_timing_group,
    kernel_call_us,
    measure_suite,
    suite_specs,
    typical_call_means,
)

ROOT = Path(__file__).resolve().parents[2]


def test_round_order_rotates_and_reverses_every_other_round():
    assert round_order(6, 0, 3) == [0, 1, 2, 3, 4, 5]
    assert round_order(6, 1, 3) == [1, 0, 5, 4, 3, 2]  # shifted by 2, reversed
    assert round_order(6, 2, 3) == [4, 5, 0, 1, 2, 3]  # shifted by 4


def test_every_round_replays_every_run_once_and_firsts_differ():
    runs, rounds = 114, 15
    orders = [round_order(runs, r, rounds) for r in range(rounds)]
    assert all(sorted(o) == list(range(runs)) for o in orders)
    # a drift at the start of each round falls on another run each time
    assert len({o[0] for o in orders}) == rounds


def _kernel(sid, ts, corr):
    return {"cat": "kernel", "name": "k", "ts": ts, "dur": 1.0,
            "args": {"stream": sid, "correlation": corr}}


def test_segment_records_split_one_round_by_list_with_each_lists_markers():
    first = [ReplayCall("kernel", "a", stream="F"), ReplayCall("kernel", "b", stream="S"),
             ReplayCall("kernel", "c", stream="F")]
    second = [ReplayCall("kernel", "d", stream="X")]
    # the pool hands stream id 7 to F in the first list and to X in the second
    events = [_kernel(7, 0.0, 1), _kernel(8, 1.0, 2),           # markers F, S
              _kernel(7, 10.0, 3), _kernel(8, 11.0, 4), _kernel(7, 12.0, 5),
              _kernel(7, 20.0, 6),                              # marker X
              _kernel(7, 30.0, 7),
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 29.0, "dur": 0.5,
               "args": {"correlation": 7}}]
    segments = [(gpu_streams(first), gpu_counts(first)), (gpu_streams(second),
                                                          gpu_counts(second))]
    # records listed out of time order come back sorted
    one, two = segment_records({"traceEvents": events[::-1]}, segments)
    assert one == {"F": [(10_000, 11_000, None), (12_000, 13_000, None)],
                   "S": [(11_000, 12_000, None)]}
    assert two == {"X": [(30_000, 31_000, (29_000, 29_500))]}
    with pytest.raises(ValueError, match="the 2 replays issued 7"):
        segment_records({"traceEvents": events[:-2]}, segments)


def test_kernel_call_us_is_the_median_kernel_call_span():
    calls = [ReplayCall("kernel", "a", stream="F"), ReplayCall("record", "r", stream="F"),
             ReplayCall("kernel", "b", stream="F"), ReplayCall("kernel", "c", stream="F")]
    stamps = [0, 7_000, 8_000, 20_000, 29_000]  # kernels 7, 12, 9 µs
    assert kernel_call_us((calls, stamps, {})) == 9.0
    assert kernel_call_us((calls[1:2], [0, 1_000], {})) is None


class _Stream:
    def __init__(self, sid: int) -> None:
        self.sid = sid


class _Session:
    """A fake profiler session: the GPU records kernels into ``events`` while it is open."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu, self.events = gpu, []

    def __enter__(self):
        self.gpu.session = self
        return self

    def __exit__(self, *exc) -> None:
        self.gpu.session = None

    def export_chrome_trace(self, path: str) -> None:
        Path(path).write_text(json.dumps({"traceEvents": self.events}), encoding="utf-8")


class FakeGpu:
    """Kernels only: ``sleep`` runs at once for 2 µs on the current stream; a pool of two
    stream ids (as CUDA's pool reuses streams); the trace clock is the host's + 500 µs."""

    def __init__(self) -> None:
        self.now, self.made, self.current, self.session, self.correlation = 0, 0, None, None, 0
        self.sleeps = 0

    def clock(self) -> int:
        self.now += 1000
        return self.now

    def stream(self) -> _Stream:
        self.made += 1
        return _Stream(self.made % 2)

    def set_stream(self, stream: _Stream) -> None:
        self.current = stream

    def sleep(self, cycles: int) -> None:
        self.sleeps += 1
        if self.session is None:
            return
        self.correlation += 1
        ts = self.now / 1000 + 500.5  # inside the call: after the stamp before it
        self.session.events += [
            {"cat": "kernel", "name": "sleep", "ts": ts, "dur": 2.0,
             "args": {"stream": self.current.sid, "correlation": self.correlation}},
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 0.25, "dur": 0.1,
             "args": {"correlation": self.correlation}}]

    def synchronize(self) -> None:
        pass

    def default_stream(self) -> None:
        self.current = None


def test_replay_rounds_gives_each_list_one_replay_a_round_on_the_host_clock():
    lists = [[ReplayCall("kernel", "a", stream="F"), ReplayCall("kernel", "b", stream="S")],
             [ReplayCall("kernel", "c", stream="X")],
             [ReplayCall("kernel", "d", stream="F"), ReplayCall("kernel", "e", stream="F")]]
    gpu = FakeGpu()
    out = replay_rounds(lists, 1.0, rounds=3, warmup=1, api=gpu,
                        session=lambda: _Session(gpu))
    assert [len(replays) for replays in out] == [3, 3, 3]
    # warm-up: the 5 kernels; each round: markers (2 + 1 + 1 streams) and kernels
    # (2 + 1 + 2), plus the lead list's markers and kernels again: list 0 leads rounds 0 and
    # 1 (orders 0 1 2 and 0 2 1), list 2 round 2 (order 2 0 1)
    assert gpu.sleeps == 5 + 3 * 9 + (2 + 2) * 2 + (1 + 2)
    for calls, replays in zip(lists, out, strict=True):
        for stamps, spans in replays:
            assert len(stamps) == len(calls) + 1
            # trace = host + 500.5 µs for a kernel, its runtime record at host + 500.25 to
            # 500.35 µs (host: the stamp before the call); the stamp after is 1 µs later, so
            # the offset lies in [500.35 - 1, 500.25] µs, taken at its middle 499.8 µs:
            # each kernel lands 0.7 µs after the stamp before its call
            starts = [stamps[i] + 700 for i, c in enumerate(calls)]
            got = sorted(start for stream in spans.values() for start, _ in stream)
            assert got == starts


def test_typical_call_means_is_the_median_of_each_replays_mean():
    calls = [ReplayCall("kernel", "a", stream="F"), ReplayCall("kernel", "b", stream="F")]
    spans = {"F": [(50_000, 51_000), (60_000, 61_000)]}
    # kernel calls per replay: (4, 6) -> 5; (7, 9) -> 8; (20, 30) -> 25 µs
    replays = [(calls, [0, 4_000, 10_000], spans), (calls, [0, 7_000, 16_000], spans),
               (calls, [0, 20_000, 50_000], spans)]
    assert typical_call_means(replays) == {"kernel": 8.0}  # the pooled mean is 12.67


def _fake_rounds(lists, cycles_per_us, rounds, warmup=1, log=None):
    """Each call 1 µs of host time; each kernel or copy runs when its call returns, for
    its cost (at least 1 µs)."""
    out = []
    for calls in lists:
        stamps = [1000 * i for i in range(len(calls) + 1)]
        spans: dict[str, list[tuple[int, int]]] = {}
        for i, c in enumerate(calls):
            if c.on_gpu:
                start = stamps[i + 1]
                spans.setdefault(c.stream, []).append(
                    (start, start + max(1000, round(c.cost_us * 1000))))
        out.append([(stamps, spans)] * rounds)
    return out


def test_calibration_and_suite_share_the_rounds_and_only_calibration_is_fitted(monkeypatch):
    seen = []

    def fake(lists, *args, **kwargs):
        seen.append(len(lists))
        return _fake_rounds(lists, *args, **kwargs)

    monkeypatch.setattr(timing_replay, "replay_rounds", fake)
    calibration = str(ROOT / "profiles" / "calibration" / "cal_read_done.toml")
    suite = str(ROOT / "scenarios" / "variants" / "read_done_barrier.toml")
    n_cal, n_suite = len(suite_specs([calibration])), len(suite_specs([suite]))
    group, runs, suite_replays = fit_timing_group([calibration], 1000.0, 3, [suite])
    assert seen == [n_cal + n_suite]  # one set of rounds for both
    assert [len(r) for _, r in runs] == [3] * n_cal and len(suite_replays) == n_suite
    assert group.mean_us["kernel"] == 1.0  # every call took 1 µs
    assert "in the same rounds as" in group.fitted_on
    doc = measure_suite([suite], 1000.0, 3, {"device": "fake"}, measured=suite_replays)
    assert [len(r["repeats"]) for r in doc["runs"]] == [3] * n_suite
    assert seen == [n_cal + n_suite]  # nothing replayed again
    assert doc["runs"][0]["kernel_call_us"] == [1.0, 1.0, 1.0]
