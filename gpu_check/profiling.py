"""Measure a device profile (:mod:`model.profile`) on a CUDA GPU.

Two groups, measured apart so the harness's own Python never counts as the system's cost:

- **system** (:func:`measure_system`): raw ``torch.cuda`` calls in tight loops, timed one
  call at a time with ``time.perf_counter_ns``: the host issue cost of each op kind of
  :data:`model.profile.ISSUE_KINDS` (the GPU is idle between batches, so no call waits for a
  full queue), kernel and copy durations by size with CUDA events (fill, gather, scatter,
  H2D / D2H pinned, D2D), and the GPU gap between a host ``synchronize()`` returning and
  the next kernel starting (a timed event after a sleep kernel, the sync, then a timed event
  and a kernel: the events' distance).
- **harness** (``overlap_harness.calibrate_cmd.measure_harness``, which wires the simulator
  in; this module imports no ``sim``): the protocol replayed on ``CudaDevice`` over
  calibration scenarios (``profiles/calibration/``, not the bundled suite), beside the same
  run on the simulator. :func:`harness_from_timelines` (pure, tested on CPU) reads the
  host's cost of each call kind off the measured timeline (the host time between one call
  and the next, charged to the later call, as ``SimDevice`` charges a launch before the
  issue) and the extra GPU time of each kernel and copy over its simulated duration (its
  ``_sleep`` cost). Per op name too, so a replay of a known op is predicted by its own cost.

torch.profiler is used for one cross-check (:func:`profiler_launch_us`): the CPU time of
``cudaLaunchKernel`` in the trace, the driver's share of the kernel launch cost.
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from overlap_harness.gpu_check.semantics_check import driver_version
from overlap_harness.model.profile import HARNESS_KINDS, ISSUE_KINDS, Figure, SizePoint
from overlap_harness.model.trace import HOST, OpId, OpKind, OpRecord

SIZES_BYTES = (4096, 65536, 1 << 20, 16 << 20)
_HOST_BLOCKING = (OpKind.HOST_SYNC, OpKind.HOST_WORK, OpKind.QUERY, OpKind.HOST_WRITE)
_STREAM_OPS = (OpKind.KERNEL, OpKind.COPY)
ZERO = Figure(0.0, 0.0, 0.0, 1)


def _per_call(fn: Callable[[], Any], calls: int, batches: int,
              between: Callable[[], Any]) -> Figure:
    """Host µs of each of ``calls`` calls of ``fn``, in ``batches`` batches with ``between``
    (a synchronize) after each, so the GPU queue never fills."""
    samples = []
    for _ in range(batches):
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            samples.append((time.perf_counter_ns() - t0) / 1000)
        between()
    return Figure.of(samples)


def measure_issue(calls: int = 100, batches: int = 5) -> dict[str, Figure]:
    """The host issue cost of each op kind in :data:`ISSUE_KINDS`, on raw torch.cuda."""
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    dev = torch.zeros(256, dtype=torch.int32, device="cuda")
    pinned = torch.zeros(256, dtype=torch.int32).pin_memory()
    pageable = torch.zeros(256, dtype=torch.int32)
    ev = torch.cuda.Event()
    with torch.cuda.stream(s1):
        ev.record()
    torch.cuda.synchronize()

    def on_s1(f: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            with torch.cuda.stream(s1):
                return f()
        return call

    kinds: dict[str, Callable[[], Any]] = {
        "kernel_launch": on_s1(lambda: dev.add_(1)),
        "h2d_pinned": on_s1(lambda: dev.copy_(pinned, non_blocking=True)),
        "h2d_pageable": on_s1(lambda: dev.copy_(pageable, non_blocking=True)),
        "d2h_pinned": on_s1(lambda: pinned.copy_(dev, non_blocking=True)),
        "d2h_pageable": on_s1(lambda: pageable.copy_(dev, non_blocking=True)),
        "event_record": lambda: ev.record(s1),
        "wait_event": lambda: s2.wait_event(ev),
        "wait_stream": lambda: s2.wait_stream(s1),
        "query": ev.query,
        "synchronize": s1.synchronize,
        "record_stream": lambda: dev.record_stream(s2),
    }
    out = {}
    for kind in ISSUE_KINDS:
        fn = kinds[kind]
        for _ in range(10):  # warm up: first calls load modules and allocate
            fn()
        torch.cuda.synchronize()
        out[kind] = _per_call(fn, calls, batches, torch.cuda.synchronize)
    return out


def measure_sync_to_launch(repeats: int = 50, sleep_cycles: int = 100_000) -> Figure:
    """GPU µs between the end of the work a host sync waited for and the start of the next
    kernel the host launches after the sync returns."""
    s = torch.cuda.Stream()
    x = torch.zeros(16, device="cuda")
    gaps = []
    with torch.cuda.stream(s):
        for i in range(repeats + 3):
            done, nxt = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(sleep_cycles)
            done.record()
            s.synchronize()
            nxt.record()
            x.add_(1)
            s.synchronize()
            if i >= 3:
                gaps.append(done.elapsed_time(nxt) * 1000)
    return Figure.of(gaps)


def _timed(fn: Callable[[], Any], stream: torch.cuda.Stream, repeats: int) -> Figure:
    """GPU µs of ``fn`` on ``stream`` between two timing events, over ``repeats`` runs."""
    samples = []
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) * 1000)
    return Figure.of(samples)


def measure_durations(sizes: Sequence[int] = SIZES_BYTES,
                      repeats: int = 20) -> dict[str, tuple[SizePoint, ...]]:
    """GPU durations by size (bytes of int32 data) of the protocol's op kinds."""
    s = torch.cuda.Stream()
    out: dict[str, list[SizePoint]] = defaultdict(list)
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        src = torch.arange(n, dtype=torch.int32, device="cuda")
        dst = torch.empty_like(src)
        idx = torch.randperm(n, device="cuda")
        host = torch.empty(n, dtype=torch.int32).pin_memory()
        ops: dict[str, Callable[[], Any]] = {
            "fill": lambda dst=dst: dst.fill_(7),
            "gather": lambda src=src, idx=idx: src.index_select(0, idx),
            "scatter": lambda dst=dst, idx=idx, src=src: dst.index_copy_(0, idx, src),
            "h2d_pinned": lambda dst=dst, host=host: dst.copy_(host, non_blocking=True),
            "d2h_pinned": lambda dst=dst, host=host: host.copy_(dst, non_blocking=True),
            "d2d": lambda dst=dst, src=src: dst.copy_(src),
        }
        for name, fn in ops.items():
            out[name].append(SizePoint(nbytes, _timed(fn, s, repeats)))
    return {k: tuple(v) for k, v in out.items()}


def profiler_launch_us(launches: int = 200) -> float | None:
    """Median CPU µs of ``cudaLaunchKernel`` in a torch.profiler trace of tiny kernels (None
    when the trace has no such event)."""
    from torch.profiler import ProfilerActivity, profile  # deferred: heavy, GPU-only use

    x = torch.zeros(16, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(launches):
            x.add_(1)
        torch.cuda.synchronize()
    times = [e.cpu_time_total for e in prof.events()
             if e.name in ("cudaLaunchKernel", "cudaLaunchKernelExC")]
    return statistics.median(times) if times else None


# -- harness: from timelines (pure) ----------------------------------------------------------

def _key_counts(timeline: Iterable[OpRecord]) -> dict[tuple[str, str, int, int], OpRecord]:
    """Each kernel / copy keyed by (agent, name, iteration, occurrence in that iteration)."""
    seen: dict[tuple[str, str, int], int] = defaultdict(int)
    out = {}
    for r in sorted(timeline, key=lambda r: r.op):
        if r.kind in _STREAM_OPS:
            k = (r.agent, r.name, r.iteration)
            out[(*k, seen[k])] = r
            seen[k] += 1
    return out


def harness_from_timelines(
    pairs: Iterable[tuple[Sequence[OpRecord], Sequence[OpRecord]]],
) -> tuple[dict[str, Figure], dict[str, Figure], dict[str, Figure], dict[str, Figure]]:
    """The harness's costs from (measured, simulated) timelines of the same runs.

    Returns ``(issue_us, extra_us, issue_by_op_us, extra_by_op_us)``: the host cost of each
    kind of :data:`HARNESS_KINDS` (the host time from the previous call, or the end of the
    previous blocking host action, to this call's issue; after a host sync the time beyond
    the next call's own kind median is ``sync_return``), and each kernel's / copy's extra GPU
    time over its simulated duration; ``*_by_op_us`` the same by ``kind:name`` (kernels and
    copies). Kinds without samples get 0 (n=1).
    """
    gaps: dict[str, list[float]] = defaultdict(list)
    by_op: dict[str, list[float]] = defaultdict(list)
    after_sync: list[tuple[str, float]] = []
    spans: list[float] = []
    extra: dict[str, list[float]] = defaultdict(list)
    extra_op: dict[str, list[float]] = defaultdict(list)
    for measured, simulated in pairs:
        host_order = sorted(measured, key=lambda r: (r.issue_ns, r.op))
        for prev, cur in itertools.pairwise(host_order):
            free_at = prev.end_ns if prev.agent == HOST and prev.kind in _HOST_BLOCKING \
                else prev.issue_ns
            gap = max(0, cur.issue_ns - free_at) / 1000
            if prev.agent == HOST and prev.kind == OpKind.HOST_SYNC:
                after_sync.append((str(cur.kind), gap))
                continue
            gaps[str(cur.kind)].append(gap)
            if cur.kind in _STREAM_OPS:
                by_op[f"{cur.kind}:{cur.name}"].append(gap)
        spans += idle_sync_spans(measured)
        sim = _key_counts(simulated)
        for key, r in _key_counts(measured).items():
            twin = sim.get(key)
            if twin is None:
                continue
            more = ((r.end_ns - r.start_ns) - (twin.end_ns - twin.start_ns)) / 1000
            extra[str(r.kind)].append(more)
            extra_op[f"{r.kind}:{r.name}"].append(more)
    medians = {k: statistics.median(v) for k, v in gaps.items()}
    gaps["sync_return"] = [max(0.0, g - medians.get(k, 0.0)) for k, g in after_sync]
    gaps["sync_span"] = spans
    issue = {k: Figure.of(gaps[k]) if gaps.get(k) else ZERO for k in HARNESS_KINDS}
    extra_fig = {k: Figure.of([max(0.0, x) for x in extra[k]]) if extra.get(k) else ZERO
                 for k in ("kernel", "copy")}
    return (issue, extra_fig, {k: Figure.of(v) for k, v in by_op.items()},
            {k: Figure.of([max(0.0, x) for x in v]) for k, v in extra_op.items()})


def idle_sync_spans(timeline: Sequence[OpRecord]) -> list[float]:
    """The blocked span (µs) of each host sync whose stream work had all ended by the time
    it started: the sync's own cost, with nothing to wait for."""
    stream_ends = sorted((r.issue_ns, r.end_ns) for r in timeline if r.agent != HOST)
    out = []
    latest = None
    index = 0
    for r in sorted(timeline, key=lambda r: (r.issue_ns, r.op)):
        if r.agent != HOST or r.kind != OpKind.HOST_SYNC:
            continue
        while index < len(stream_ends) and stream_ends[index][0] <= r.start_ns:
            end = stream_ends[index][1]
            latest = end if latest is None else max(latest, end)
            index += 1
        if latest is None or latest <= r.start_ns:
            out.append((r.end_ns - r.start_ns) / 1000)
    return out


def timelines_to_data(pairs: Iterable[tuple[Sequence[OpRecord], Sequence[OpRecord]]],
                      run_ids: Sequence[str] = ()) -> list[dict[str, Any]]:
    """(measured, simulated) timelines as JSON-ready lists, with the run each came from
    (``run_ids``, in the same order, when given), so a profile's harness part can be fitted
    again later without the GPU (:func:`timelines_from_data`)."""
    fields = ("op", "name", "agent", "kind", "issue_ns", "start_ns", "end_ns", "label",
              "iteration")

    def rows(tl: Sequence[OpRecord]) -> list[list[Any]]:
        return [[str(r.kind) if f == "kind" else getattr(r, f) for f in fields] for r in tl]

    ids = list(run_ids)
    return [{"fields": list(fields), "run_id": ids[i] if i < len(ids) else None,
             "measured": rows(m), "simulated": rows(s)} for i, (m, s) in enumerate(pairs)]


def timelines_from_data(data: Sequence[Mapping[str, Any]],
                        ) -> list[tuple[list[OpRecord], list[OpRecord]]]:
    """:func:`timelines_to_data` read back."""
    def records(rows: Sequence[Sequence[Any]]) -> list[OpRecord]:
        return [OpRecord(OpId(r[0]), r[1], r[2], OpKind(r[3]), int(r[4]), int(r[5]),
                         int(r[6]), r[7], int(r[8])) for r in rows]

    return [(records(d["measured"]), records(d["simulated"])) for d in data]


def environment() -> dict[str, str]:
    """Device, driver, torch, CUDA and Python versions."""
    return {"device": torch.cuda.get_device_name(), "driver": str(driver_version()),
            "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "python": platform.python_version()}


def by_kind(figures: Mapping[str, Figure]) -> str:
    """One line: each kind's median µs (for progress output)."""
    return ", ".join(f"{k} {f.median:.1f}" for k, f in figures.items())
