"""The timing replay's op list, and the measured timeline built back from it (pure).

A scenario run on the simulator issues a sequence of device-API calls. The timing replay
(:mod:`gpu_check.timing_replay`) issues the same calls on a GPU as raw ``torch.cuda`` calls
from a prebuilt list, so the host issues at the rate of the calls themselves, not of the
harness's Python (docs/calibration.md says why). This module holds what both ends share and
nothing that touches a GPU:

- :class:`ReplayCall`: one call of the list (what the simulator captured: its kind, stream,
  event, cost, copy size and direction, label, iteration);
- :func:`measured_timeline`: the :class:`model.trace.OpRecord` timeline of one replay, from
  the host's time stamps around each call and the GPU start/end of each kernel and copy, so
  :func:`model.metrics.compute_metrics` (the simulator's definitions) computes its metrics;
- :func:`timing_costs`: the figures a profile's ``timing`` group holds, read off measured
  replays (host time of each call kind, the GPU time of a kernel beyond its ``_sleep`` cost,
  copy durations, the span of a host sync with nothing to wait for and the wake-up after one
  that waited).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from overlap_harness.model.trace import HOST, OpId, OpKind, OpRecord

#: The kinds of call an op list holds.
CALL_KINDS = ("kernel", "copy", "record", "wait_event", "wait_stream", "synchronize", "query",
              "poll", "host_work", "host_read", "host_write", "record_stream")
#: Copy directions (pinned host memory on the host side, as the protocol's buffers are).
DIRECTIONS = ("h2d", "d2h", "d2d")
#: Calls that block the host until GPU work is done: their span is host stall.
BLOCKING = ("synchronize", "poll")
GPU_KINDS = ("kernel", "copy")


@dataclass(frozen=True, slots=True)
class ReplayCall:
    """One call of a timing replay's op list.

    Args:
        kind: one of :data:`CALL_KINDS`.
        name: the protocol's name of the op (``"verify"``, ``"sync:d2h"``).
        stream: the stream it is issued on (``""`` for host calls and device syncs).
        other: ``wait_stream``: the stream waited on; ``synchronize``: ``"stream"``,
            ``"event"`` or ``"device"``.
        event: the event's key (name and id: unique in a run), for record, waits, syncs.
        cost_us: a kernel's modelled duration (its ``_sleep``), a host work's busy time.
        nbytes / direction / blocking: a copy's size, direction (:data:`DIRECTIONS`) and
            whether the host waits for it.
        label: the sync label, if any; iteration: the scheduler iteration (-1 before).
    """

    kind: str
    name: str
    stream: str = ""
    other: str = ""
    event: str = ""
    cost_us: float = 0.0
    nbytes: int = 0
    direction: str = ""
    blocking: bool = False
    label: str | None = None
    iteration: int = -1

    @property
    def on_gpu(self) -> bool:
        """A kernel or a copy: the GPU runs it for a measurable span."""
        return self.kind in GPU_KINDS

    @property
    def stalls_host(self) -> bool:
        """The host is blocked until GPU work is done (a sync, a poll, a blocking copy)."""
        return self.kind in BLOCKING or (self.kind == "copy" and self.blocking)


def gpu_streams(calls: Sequence[ReplayCall]) -> list[str]:
    """The streams the list issues on, in order of first use."""
    seen: dict[str, None] = {}
    for c in calls:
        if c.stream:
            seen.setdefault(c.stream, None)
        if c.kind == "wait_stream" and c.other:
            seen.setdefault(c.other, None)
    return list(seen)


def gpu_counts(calls: Sequence[ReplayCall]) -> dict[str, int]:
    """How many kernels and copies each stream runs (what the GPU trace must show)."""
    counts: dict[str, int] = defaultdict(int)
    for c in calls:
        if c.on_gpu:
            counts[c.stream] += 1
    return dict(counts)


def measured_timeline(calls: Sequence[ReplayCall], stamps: Sequence[int],
                      gpu_spans: Mapping[str, Sequence[tuple[int, int]]]) -> list[OpRecord]:
    """The timeline of one replay of ``calls``.

    Args:
        stamps: host ns before the first call and after each call (``len(calls) + 1``):
            call ``i`` took ``stamps[i]`` to ``stamps[i + 1]``, the loop's own step included.
        gpu_spans: per stream, the (start, end) ns of its kernels and copies in issue order,
            on the host's clock.

    A kernel or copy is issued when its call returns and runs its GPU span; a sync, poll or
    blocking copy is a host sync over its call's span; a host work is host work over its
    span; records and waits sit at their issue time. Raises ValueError when the counts
    disagree (the GPU trace is not this list's).
    """
    if len(stamps) != len(calls) + 1:
        raise ValueError(f"expected {len(calls) + 1} host stamps, got {len(stamps)}")
    want = gpu_counts(calls)
    got = {s: len(v) for s, v in gpu_spans.items() if v}
    if want != got:
        raise ValueError(f"GPU spans per stream {got} do not match the op list's {want}")
    taken: dict[str, int] = defaultdict(int)
    out: list[OpRecord] = []
    for index, c in enumerate(calls):
        begin, end = stamps[index], stamps[index + 1]
        op = OpId(len(out))
        if c.on_gpu:
            start, stop = gpu_spans[c.stream][taken[c.stream]]
            taken[c.stream] += 1
            kind = OpKind.KERNEL if c.kind == "kernel" else OpKind.COPY
            out.append(OpRecord(op, c.name, c.stream, kind, end, start, stop, None, c.iteration))
            if c.stalls_host:
                out.append(OpRecord(OpId(op + 1), f"{c.name}.sync", HOST, OpKind.HOST_SYNC,
                                    begin, begin, end, c.label, c.iteration))
        elif c.stalls_host:
            out.append(OpRecord(op, c.name, HOST, OpKind.HOST_SYNC, begin, begin, end,
                                c.label, c.iteration))
        elif c.kind == "host_work":
            out.append(OpRecord(op, c.name, HOST, OpKind.HOST_WORK, begin, begin, end, None,
                                c.iteration))
        else:
            kind = {"record": OpKind.RECORD, "query": OpKind.QUERY,
                    "host_read": OpKind.HOST_READ, "host_write": OpKind.HOST_WRITE}.get(
                        c.kind, OpKind.WAIT)
            agent = c.stream or HOST
            out.append(OpRecord(op, c.name, agent, kind, end, end, end, c.label, c.iteration))
    return out


# -- the timing group's figures, from measured replays ---------------------------------------

def cost_key(call: ReplayCall) -> str:
    """The key a call's host time is charged under: its kind, a copy by direction."""
    return f"copy_{call.direction}" if call.kind == "copy" else call.kind


@dataclass(frozen=True, slots=True)
class TimingSamples:
    """Raw samples (µs) of the timing group, pooled over replays (see :func:`timing_costs`)."""

    call_us: dict[str, list[float]]
    kernel_extra_us: dict[str, list[float]]
    copy_us: dict[str, list[float]]
    sync_idle_us: list[float]
    sync_wake_us: list[float]
    start_gap_us: list[float]
    start_lag_us: list[float]
    wait_gap_us: list[float]
    gap_by_op_us: dict[str, list[float]]
    gap_by_transition_us: dict[str, list[float]]
    after_wait: list[tuple[str, list[tuple[str, float]]]]


def timing_costs(replays: Sequence[tuple[Sequence[ReplayCall], Sequence[int],
                                         Mapping[str, Sequence[tuple[int, int]]]]],
                 ) -> TimingSamples:
    """Samples of what each call costs in measured replays (``(calls, stamps, gpu_spans)``).

    - ``call_us[key]``: the host span of each call (:func:`cost_key`), syncs and host work
      left out (their span is a wait, or the modelled busy time: host work's key holds only
      the time beyond its cost);
    - ``kernel_extra_us["kernel:NAME"]``: a kernel's GPU span minus its ``_sleep`` cost;
    - ``copy_us[direction]``: a copy's GPU span;
    - ``sync_idle_us``: the span of a sync or poll that found its GPU work done (the latest
      end of GPU work issued before it is before the call began): its own cost;
    - ``sync_wake_us``: for one that waited, its end minus the end of that work (how long
      the host takes to notice);
    - ``start_gap_us``: a kernel's or copy's GPU start minus its stream's previous op's end,
      when it was issued before that end (queued) and no wait came between;
    - ``start_lag_us``: its GPU start minus its call's return, when its stream was idle then
      and no wait came between;
    - ``wait_gap_us``: for the first kernel or copy after a wait on its stream, its GPU start
      minus the latest of: its call's return, its stream's previous end, the end of the work
      waited for (a cross-stream wait costs the GPU more than a queued op's gap);
    - ``gap_by_op_us["kind:NAME"]``: the start gap or wait gap of each op by its name (a copy
      queued behind a kernel waits longer than a kernel behind a kernel);
    - ``gap_by_transition_us["kernel->copy"]``: the start gap (queued, no wait) by the kinds
      of the previous op on the stream and of this one;
    - ``after_wait``: for each sync, poll or blocking copy that waited, its kind
      (``"copy"`` or ``"sync"``) and the (cost key, host µs beyond a host work's cost) of the
      :data:`RETURN_CALLS` calls after it: a host that slept in a wait is slower for a while
      (:func:`return_costs` sets them against the calls' means).
    """
    calls_us: dict[str, list[float]] = defaultdict(list)
    extra: dict[str, list[float]] = defaultdict(list)
    copies: dict[str, list[float]] = defaultdict(list)
    idle: list[float] = []
    wake: list[float] = []
    gaps: list[float] = []
    lags: list[float] = []
    wait_gaps: list[float] = []
    by_op: dict[str, list[float]] = defaultdict(list)
    after: list[tuple[str, list[tuple[str, float]]]] = []
    by_transition: dict[str, list[float]] = defaultdict(list)
    for calls, stamps, spans in replays:
        taken: dict[str, int] = defaultdict(int)
        stream_end: dict[str, int] = {}  # the latest GPU end of the work issued on a stream
        event_end: dict[str, int] = {}  # ... captured by an event's latest record
        waited: dict[str, int] = {}  # streams with a wait since their last op: its work's end
        last_kind: dict[str, str] = {}  # the kind of each stream's previous kernel or copy
        for index, c in enumerate(calls):
            begin, end = stamps[index], stamps[index + 1]
            span_us = (end - begin) / 1000
            if c.on_gpu:
                start, stop = spans[c.stream][taken[c.stream]]
                taken[c.stream] += 1
                previous = stream_end.get(c.stream)
                if c.stream in waited:
                    ready = max(end, previous or 0, waited.pop(c.stream))
                    wait_gaps.append((start - ready) / 1000)
                    by_op[f"{c.kind}:{c.name}"].append((start - ready) / 1000)
                elif previous is not None and previous > end:
                    gaps.append((start - previous) / 1000)
                    by_op[f"{c.kind}:{c.name}"].append((start - previous) / 1000)
                    by_transition[f"{last_kind[c.stream]}->{c.kind}"].append(
                        (start - previous) / 1000)
                else:
                    lags.append((start - end) / 1000)
                last_kind[c.stream] = c.kind
                if c.kind == "kernel":
                    extra[f"kernel:{c.name}"].append((stop - start) / 1000 - c.cost_us)
                else:
                    copies[c.direction].append((stop - start) / 1000)
                if not c.blocking:
                    calls_us[cost_key(c)].append(span_us)
                stream_end[c.stream] = max(stream_end.get(c.stream, stop), stop)
            if c.kind == "record":
                event_end[c.event] = stream_end.get(c.stream, 0)
            elif c.kind in ("wait_event", "wait_stream"):
                upstream = event_end.get(c.event, 0) if c.kind == "wait_event" \
                    else stream_end.get(c.other, 0)
                waited[c.stream] = max(waited.get(c.stream, 0), upstream)
            if c.stalls_host:
                done = _waited_end(c, stream_end, event_end)
                if done <= begin:
                    idle.append(span_us)
                else:
                    wake.append(max(0.0, (end - done) / 1000))
                    after.append(("copy" if c.kind == "copy" else "sync",
                                  _next_calls(calls, stamps, index)))
            elif c.kind == "host_work":
                calls_us["host_work"].append(max(0.0, span_us - c.cost_us))
            elif not c.on_gpu:
                calls_us[cost_key(c)].append(span_us)
    return TimingSamples(dict(calls_us), dict(extra), dict(copies), idle, wake, gaps, lags,
                         wait_gaps, dict(by_op), dict(by_transition), after)


#: How many calls after a host wait count towards its return cost.
RETURN_CALLS = 5


def _next_calls(calls: Sequence[ReplayCall], stamps: Sequence[int],
                index: int) -> list[tuple[str, float]]:
    out = []
    for j in range(index + 1, min(len(calls), index + 1 + RETURN_CALLS)):
        c = calls[j]
        if c.stalls_host:
            break
        span = (stamps[j + 1] - stamps[j]) / 1000
        out.append((cost_key(c), span - c.cost_us if c.kind == "host_work" else span))
    return out


def return_costs(after: Sequence[tuple[str, Sequence[tuple[str, float]]]],
                 means: Mapping[str, float]) -> dict[str, list[float]]:
    """Per kind of wait (``copy``, ``sync``), the host time of the calls after each wait
    beyond those calls' means: the wait's return cost."""
    out: dict[str, list[float]] = defaultdict(list)
    for kind, following in after:
        out[kind].append(sum(span - means.get(key, 0.0) for key, span in following))
    return dict(out)


def _waited_end(call: ReplayCall, stream_end: Mapping[str, int],
                event_end: Mapping[str, int]) -> int:
    """When the GPU work a host-blocking call waits for ended (0: none)."""
    if call.kind == "copy":
        return stream_end.get(call.stream, 0)
    if call.kind == "poll" or call.other == "event":
        return event_end.get(call.event, 0)
    if call.other == "stream":
        return stream_end.get(call.stream, 0)
    return max(stream_end.values(), default=0)


def after_wait(calls: Sequence[ReplayCall]) -> list[tuple[bool, str]]:
    """For each kernel and copy of ``calls`` (in order): is it the first on its stream after
    a wait on that stream, and its transition (``"kernel->copy"``: the kind of the previous
    kernel or copy on its stream, ``"none"`` for the first, and its own)?"""
    waited: set[str] = set()
    last: dict[str, str] = {}
    out = []
    for c in calls:
        if c.kind in ("wait_event", "wait_stream"):
            waited.add(c.stream)
        elif c.on_gpu:
            out.append((c.stream in waited, f"{last.get(c.stream, 'none')}->{c.kind}"))
            waited.discard(c.stream)
            last[c.stream] = c.kind
    return out


# -- saved replays (JSON) -----------------------------------------------------------------------

Replay = tuple[Sequence[ReplayCall], Sequence[int], Mapping[str, Sequence[tuple[int, int]]]]


def replays_to_data(runs: Sequence[tuple[str, Sequence[Replay]]]) -> list[dict[str, Any]]:
    """Measured replays, by run id, as JSON-ready data (one op list per run)."""
    out = []
    for run_id, replays in runs:
        calls = replays[0][0]
        out.append({"run_id": run_id, "calls": [dataclasses.asdict(c) for c in calls],
                    "replays": [{"stamps": list(st), "spans": {k: [list(x) for x in v]
                                                               for k, v in sp.items()}}
                                for _, st, sp in replays]})
    return out


def replays_from_data(data: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Replay]]]:
    """:func:`replays_to_data` read back.

    Raises:
        KeyError, TypeError, ValueError: not such data.
    """
    out = []
    for run in data:
        calls = [ReplayCall(**c) for c in run["calls"]]
        out.append((run["run_id"], [(calls, [int(x) for x in r["stamps"]],
                                     {k: [(int(a), int(b)) for a, b in v]
                                      for k, v in r["spans"].items()})
                                    for r in run["replays"]]))
    return out
