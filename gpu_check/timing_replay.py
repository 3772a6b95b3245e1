"""The timing replay: a run's op list issued as prebound raw ``torch.cuda`` calls.

The value replay (``gpu-check``'s trials, :mod:`gpu_check.cuda_device`) issues every op through
the harness's device API: 100-450 µs of Python per op, where SGLang's scheduler pays a few µs
of launch, and that host time decides when ops end (docs/calibration.md). This replay measures
*timing* instead: the run's calls (:class:`model.op_list.ReplayCall`, captured from the
simulator) are bound once to zero-argument callables (:func:`bind_calls`), then issued in a
tight loop that only stamps the host clock after each call (:func:`issue`): no recorder, no
gates, no staging. A kernel is ``torch.cuda._sleep`` of its cost on its stream, a copy a real
``copy_`` of its byte size between pinned host and device memory, a host work a busy-wait of
its cost, a host read a read of pinned memory; events, waits, syncs and queries are the calls
themselves.

GPU start and end of every kernel and copy come from torch.profiler's CUDA activity (CUPTI:
per-stream timestamps, no call added to the list), mapped back to the list by stream and
order (:func:`trace_records`). The streams are told apart by one marker kernel per stream
before the replays, and the GPU clock is put on ``perf_counter_ns``'s by the runtime records
(``cudaLaunchKernel``, ``cudaMemcpyAsync``) the same trace holds for each kernel and copy:
each lies inside the host stamps around its call (:func:`clock_offset`).

A suite is measured in interleaved rounds (:func:`replay_rounds`): every list once a round,
one profiler session a round, split back into lists by :func:`segment_records`.

The calls are built against an ``api`` object (:class:`TorchApi` on a GPU), so the binding is
tested on the CPU with a fake one.
"""

from __future__ import annotations

import functools
import gc
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.op_list import ReplayCall, gpu_counts, gpu_streams

Call = Callable[[], Any]
Spans = dict[str, list[tuple[int, int]]]
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


class TorchApi:
    """What :func:`bind_calls` needs from torch.cuda (the real GPU)."""

    def __init__(self) -> None:
        import torch  # deferred: a CPU test passes a fake api and needs no torch.cuda

        self.torch = torch
        self.set_stream = torch.cuda.set_stream
        self.sleep = torch.cuda._sleep
        self.synchronize = torch.cuda.synchronize
        self.clock = time.perf_counter_ns

    def default_stream(self) -> None:
        """Issue on the default stream again (after a replay)."""
        self.set_stream(self.torch.cuda.default_stream())

    def stream(self) -> Any:
        """A new stream."""
        return self.torch.cuda.Stream()

    def event(self) -> Any:
        """A new event (no timing: the replay times with the profiler)."""
        return self.torch.cuda.Event()

    def device_bytes(self, nbytes: int) -> Any:
        """A device tensor of ``nbytes`` bytes."""
        return self.torch.zeros(max(1, nbytes), dtype=self.torch.uint8, device="cuda")

    def pinned_bytes(self, nbytes: int) -> Any:
        """A pinned host tensor of ``nbytes`` bytes."""
        return self.torch.zeros(max(1, nbytes), dtype=self.torch.uint8).pin_memory()


def _busy_wait(clock: Callable[[], int], ns: int) -> None:
    """Keep the host busy for ``ns`` ns (host work: the scheduler's own Python)."""
    end = clock() + ns
    while clock() < end:
        pass


def _poll(query: Callable[[], bool]) -> None:
    while not query():
        pass


def _on(set_stream: Callable[[Any], None], stream: Any, fn: Call) -> Call:
    def call() -> Any:
        set_stream(stream)
        return fn()
    return call


class Bound:
    """A run's op list bound to one api: the streams by name and the callables in order."""

    def __init__(self, calls: Sequence[ReplayCall], api: Any, cycles_per_us: float) -> None:
        self.calls = list(calls)
        self.api = api
        self.streams = {name: api.stream() for name in gpu_streams(calls)}
        self.events: dict[str, Any] = {}
        self._device: dict[int, Any] = {}
        self._pinned: dict[int, Any] = {}
        self.program = [self._bind(c, cycles_per_us) for c in calls]

    def _event(self, key: str) -> Any:
        if key not in self.events:
            self.events[key] = self.api.event()
        return self.events[key]

    def _dev(self, nbytes: int) -> Any:
        if nbytes not in self._device:
            self._device[nbytes] = self.api.device_bytes(nbytes)
        return self._device[nbytes]

    def _pin(self, nbytes: int) -> Any:
        if nbytes not in self._pinned:
            self._pinned[nbytes] = self.api.pinned_bytes(nbytes)
        return self._pinned[nbytes]

    def _bind(self, c: ReplayCall, cycles_per_us: float) -> Call:
        api, stream = self.api, self.streams.get(c.stream)
        if c.kind == "kernel":
            cycles = max(0, round(c.cost_us * cycles_per_us))
            return _on(api.set_stream, stream, functools.partial(api.sleep, cycles))
        if c.kind == "copy":
            src, dst = {"h2d": (self._pin, self._dev), "d2h": (self._dev, self._pin),
                        "d2d": (self._dev, self._dev)}[c.direction]
            source = src(c.nbytes)
            target = dst(c.nbytes) if c.direction != "d2d" else api.device_bytes(c.nbytes)
            copy = functools.partial(target.copy_, source, non_blocking=not c.blocking)
            return _on(api.set_stream, stream, copy)
        if c.kind == "record":
            return functools.partial(self._event(c.event).record, stream)
        if c.kind == "wait_event":
            return functools.partial(stream.wait_event, self._event(c.event))
        if c.kind == "wait_stream":
            return functools.partial(stream.wait_stream, self.streams[c.other])
        if c.kind == "record_stream":
            return functools.partial(self._dev(8).record_stream, stream)
        if c.kind == "synchronize":
            if c.other == "stream":
                return stream.synchronize
            if c.other == "event":
                return self._event(c.event).synchronize
            return api.synchronize
        if c.kind == "query":
            return self._event(c.event).query
        if c.kind == "poll":
            return functools.partial(_poll, self._event(c.event).query)
        if c.kind == "host_work":
            return functools.partial(_busy_wait, api.clock, round(c.cost_us * 1000))
        if c.kind == "host_read":
            return self._pin(c.nbytes).tolist
        if c.kind == "host_write":
            return functools.partial(self._pin(c.nbytes).fill_, 1)
        raise ValueError(f"op list: unknown call kind {c.kind!r} ({c.name})")


def bind_calls(calls: Sequence[ReplayCall], api: Any, cycles_per_us: float) -> Bound:
    """Every call of ``calls`` as a prebound zero-argument callable on ``api`` (module
    docstring); resources (streams, events, tensors) are made here, before any timing."""
    return Bound(calls, api, cycles_per_us)


def issue(program: Sequence[Call], clock: Callable[[], int]) -> list[int]:
    """Run ``program`` in a tight loop; the host clock before the first call and after each."""
    stamps = [clock()]
    stamp = stamps.append
    for fn in program:
        fn()
        stamp(clock())
    return stamps


def markers(bound: Bound) -> None:
    """One ``_sleep(0)`` kernel per stream, in :func:`gpu_streams` order, each alone on the
    GPU: the trace's first GPU records, which name its stream ids."""
    api = bound.api
    for stream in bound.streams.values():
        api.set_stream(stream)
        api.sleep(0)
        api.synchronize()


# -- the profiler trace -> GPU spans (pure) -------------------------------------------------

def _ns(us: float) -> int:
    return round(us * 1000)


#: One GPU record: (start, end) on the trace's clock and its runtime call's (start, end) there
#: (the ``cudaLaunchKernel`` / ``cudaMemcpyAsync`` record of the same correlation id; None
#: where the trace has none).
Raw = tuple[int, int, tuple[int, int] | None]


def _trace_parts(trace: Mapping[str, Any],
                 ) -> tuple[list[Mapping[str, Any]], dict[Any, tuple[int, int]]]:
    """The trace's GPU records by start time, and its runtime records' spans by correlation id."""
    events = trace.get("traceEvents", [])
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATEGORIES and "dur" in e),
                 key=lambda e: e["ts"])
    runtime = {e["args"]["correlation"]: (_ns(e["ts"]), _ns(e["ts"] + e["dur"]))
               for e in events if e.get("cat") == "cuda_runtime" and "dur" in e
               and "correlation" in e.get("args", {})}
    return gpu, runtime


def _records(gpu: Sequence[Mapping[str, Any]], runtime: Mapping[Any, tuple[int, int]],
             streams: Sequence[str], counts: Mapping[str, int], repeats: int,
             ) -> list[dict[str, list[Raw]]]:
    if len(gpu) < len(streams):
        raise ValueError(f"the trace has {len(gpu)} GPU records; expected at least "
                         f"{len(streams)} markers first")
    ids = {gpu[index]["args"]["stream"]: name for index, name in enumerate(streams)}
    if len(ids) != len(streams):
        raise ValueError("two marker kernels ran on one stream: cannot tell streams apart")
    per_stream: dict[str, list[Raw]] = defaultdict(list)
    for e in gpu[len(streams):]:
        name = ids.get(e["args"]["stream"])
        if name is None:
            raise ValueError(f"a GPU record on unknown stream {e['args']['stream']}: {e['name']}")
        start = _ns(e["ts"])
        per_stream[name].append((start, start + _ns(e["dur"]),
                                 runtime.get(e["args"].get("correlation"))))
    out: list[dict[str, list[Raw]]] = [{} for _ in range(repeats)]
    for name, records in per_stream.items():
        each = counts.get(name, 0)
        if len(records) != each * repeats:
            raise ValueError(f"stream {name}: {len(records)} GPU records, expected "
                             f"{each * repeats}")
        for rep in range(repeats):
            out[rep][name] = records[rep * each:(rep + 1) * each]
    return out


def trace_records(trace: Mapping[str, Any], streams: Sequence[str], counts: Mapping[str, int],
                  repeats: int) -> list[dict[str, list[Raw]]]:
    """Per replay, per stream, its kernels and copies as :data:`Raw` records, in order.

    ``trace`` is a Chrome trace as torch.profiler exports it; its first GPU records are one
    marker kernel per stream (:func:`markers`), in ``streams`` order, which tell the trace's
    stream ids apart; ``counts`` the kernels and copies per stream of one replay
    (:func:`model.op_list.gpu_counts`).

    Raises:
        ValueError: the trace lacks the markers or holds another number of GPU records.
    """
    gpu, runtime = _trace_parts(trace)
    return _records(gpu, runtime, streams, counts, repeats)


def segment_records(trace: Mapping[str, Any],
                    segments: Sequence[tuple[Sequence[str], Mapping[str, int]]],
                    ) -> list[dict[str, list[Raw]]]:
    """One replay of each of several op lists, issued one after the other in one profiler
    session (each list's markers, then its replay, the GPU synchronized before the next):
    per segment, in order, its records per stream (:func:`trace_records` of one replay).

    ``segments`` holds each list's streams and counts. The GPU records, by start time, fall
    into consecutive chunks of ``len(streams) + sum(counts)`` (the synchronize between lists
    keeps them apart), so a stream the CUDA stream pool hands to two lists is told apart by
    the markers of each.

    Raises:
        ValueError: the trace holds another number of GPU records, or a chunk is not its
            list's (see :func:`trace_records`).
    """
    gpu, runtime = _trace_parts(trace)
    sizes = [len(streams) + sum(counts.values()) for streams, counts in segments]
    if len(gpu) != sum(sizes):
        raise ValueError(f"the trace has {len(gpu)} GPU records; the {len(segments)} replays "
                         f"issued {sum(sizes)} (markers included)")
    out, begin = [], 0
    for (streams, counts), size in zip(segments, sizes, strict=True):
        out.append(_records(gpu[begin:begin + size], runtime, streams, counts, 1)[0])
        begin += size
    return out


def clock_offset(calls: Sequence[ReplayCall], stamps: Sequence[int],
                 records: Mapping[str, Sequence[Raw]]) -> float:
    """The trace clock minus the host clock, from the runtime records of the replay's calls.

    Each call's runtime record lies inside the host stamps around the call, so the offset is
    at least ``record end - stamp after`` and at most ``record start - stamp before``; the
    middle of the intersection of those bounds over all calls (when it is empty, as a late
    stamp can make it, the median of each call's own middle). A trace without runtime records
    takes the median op as starting when its call returned (coarser).
    """
    lows, highs = [], []
    taken: dict[str, int] = defaultdict(int)
    for index, c in enumerate(calls):
        if not c.on_gpu:
            continue
        record = records[c.stream][taken[c.stream]][2]
        taken[c.stream] += 1
        if record is not None:
            lows.append(record[1] - stamps[index + 1])
            highs.append(record[0] - stamps[index])
    if not lows:  # no runtime records: take each op as starting when its call returns
        taken.clear()
        starts = []
        for index, c in enumerate(calls):
            if c.on_gpu:
                starts.append(records[c.stream][taken[c.stream]][0] - stamps[index + 1])
                taken[c.stream] += 1
        return statistics.median(starts) if starts else 0.0
    low, high = max(lows), min(highs)
    if low <= high:
        return (low + high) / 2
    return statistics.median((a + b) / 2 for a, b in zip(lows, highs, strict=True))


def aligned_spans(calls: Sequence[ReplayCall], stamps: Sequence[int],
                  records: Mapping[str, Sequence[Raw]]) -> Spans:
    """The replay's GPU spans on the host clock (:func:`clock_offset`)."""
    offset = clock_offset(calls, stamps, records)
    return {name: [(round(a - offset), round(b - offset)) for a, b, _ in rs]
            for name, rs in records.items()}


# -- the suite, measured in interleaved rounds (GPU) ------------------------------------------

def round_order(runs: int, round_index: int, rounds: int) -> list[int]:
    """The order the runs are replayed in, in round ``round_index`` of ``rounds``: rotated by
    ``round_index * runs // rounds`` places and reversed in odd rounds, so each run takes
    other places and other neighbours from round to round (a drift of the host is then spread
    over all runs instead of hitting one run's replays together)."""
    shift = (round_index * runs) // max(1, rounds)
    order = [(index + shift) % runs for index in range(runs)]
    return order[::-1] if round_index % 2 else order


def profiler_session() -> Any:
    """A torch.profiler session recording CUDA activity (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile  # deferred: GPU-only, heavy

    return profile(activities=[ProfilerActivity.CUDA])


def replay_rounds(lists: Sequence[Sequence[ReplayCall]], cycles_per_us: float, rounds: int,
                  warmup: int = 1, log: Callable[[str], None] | None = None,
                  api: Any = None, session: Callable[[], Any] = profiler_session,
                  ) -> list[list[tuple[list[int], Spans]]]:
    """Replay every op list of ``lists`` once per round, ``rounds`` rounds, in the order of
    :func:`round_order`; per list, its measured replays (host stamps, GPU spans), one a round.

    All lists are bound first (on ``api``, :class:`TorchApi` by default). ``warmup`` rounds
    are issued without the profiler and discarded. Each measured round is one profiler
    session (``session()``: a context manager with ``export_chrome_trace``); inside it every
    list gets its markers, one replay and a device synchronize, and the round's first list is
    replayed once more before them, discarded (the session's own start is nobody's
    measurement). The GC is off during a round (a collection pause is the harness's, not the
    system's).
    """
    api = TorchApi() if api is None else api
    bound = [bind_calls(calls, api, cycles_per_us) for calls in lists]
    for _ in range(warmup):
        for b in bound:
            issue(b.program, api.clock)
            api.synchronize()
    out: list[list[tuple[list[int], Spans]]] = [[] for _ in bound]
    for round_index in range(rounds):
        order = round_order(len(bound), round_index, rounds)
        issued = [order[0], *order]  # the lead replay, discarded, then every list once
        stamps: list[list[int]] = []
        started = time.perf_counter()
        gc.collect()
        gc.disable()
        try:
            with session() as prof:
                for index in issued:
                    markers(bound[index])
                    stamps.append(issue(bound[index].program, api.clock))
                    api.synchronize()
        finally:
            gc.enable()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text(encoding="utf-8"))
        records = segment_records(trace, [(list(bound[i].streams), gpu_counts(bound[i].calls))
                                          for i in issued])
        for index, st, rec in zip(issued[1:], stamps[1:], records[1:], strict=True):
            out[index].append((st, aligned_spans(bound[index].calls, st, rec)))
        if log is not None:
            log(f"round {round_index + 1}/{rounds}: {len(order)} runs in "
                f"{time.perf_counter() - started:.1f} s")
    api.default_stream()
    return out
