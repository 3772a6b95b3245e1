"""Chrome / Perfetto trace JSON, laid out as torch.profiler users know it.

One process per device (``pid``: the simulated run, and a measured GPU run if given), one
thread per agent (``tid``: host, schedule, forward, d2h, ...), named by ``process_name`` /
``thread_name`` metadata events. Ops are complete slices (``ph: "X"``, ``ts``/``dur`` in
microseconds) with the label, iteration and source line in ``args``; zero-length ops
(records, waits, host reads) are instant events (``ph: "i"``). Flow arrows (``ph: "s"`` then
``"f"`` with one ``id``) join each event record to the waits bound to it, and the two
accesses of each race (``cat: "race"``).

Large traces are written gzip-compressed (``trace.json.gz``, which Perfetto and
chrome://tracing open as they are): a 10,000-iteration run's trace was 114 MB as text. Past
:data:`MAX_EVENTS` events the trace is capped, with a metadata event saying so.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import OpKind, OpRecord
from overlap_harness.reports.lanes import event_arrows, lane_order

_INSTANT = (OpKind.RECORD, OpKind.WAIT, OpKind.HOST_READ, OpKind.HOST_WRITE, OpKind.QUERY,
            OpKind.ALLOC, OpKind.FREE)


def _us(ns: int) -> float:
    return ns / 1000.0


def _events_for(timeline: Sequence[OpRecord], pid: int, pname: str) -> tuple[list[dict], dict]:
    lanes = lane_order(timeline)
    tid = {a: i + 1 for i, a in enumerate(lanes)}
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}}]
    ev += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid[a], "args": {"name": a}}
           for a in lanes]
    ev += [{"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid[a],
            "args": {"sort_index": tid[a]}} for a in lanes]
    for t in sorted(timeline, key=lambda t: (t.start_ns, t.op)):
        args = {"op": t.op, "iteration": t.iteration, "kind": str(t.kind)}
        if t.label:
            args["label"] = t.label
        if t.source:
            args["source"] = t.source
        base = {"name": t.name, "cat": str(t.kind), "pid": pid, "tid": tid[t.agent],
                "ts": _us(t.start_ns), "args": args}
        if t.kind in _INSTANT or t.end_ns <= t.start_ns:
            ev.append({**base, "ph": "i", "s": "t"})
        else:
            ev.append({**base, "ph": "X", "dur": _us(t.end_ns - t.start_ns)})
    return ev, tid


def _flow(fid: int, name: str, cat: str, pid: int, a: tuple[int, float],
          b: tuple[int, float]) -> list[dict[str, Any]]:
    return [{"ph": "s", "id": fid, "name": name, "cat": cat, "pid": pid, "tid": a[0],
             "ts": a[1]},
            {"ph": "f", "bp": "e", "id": fid, "name": name, "cat": cat, "pid": pid,
             "tid": b[0], "ts": b[1]}]


def trace_events(case: CaseResult, gpu_timeline: Sequence[OpRecord] | None = None) -> list[dict]:
    """All trace events of one case: slices, metadata, record->wait and race flows."""
    ev, tid = _events_for(case.timeline, 1, f"sim: {case.name}")
    fid = 1
    for rec, wait in event_arrows(case.timeline):
        ev += _flow(fid, rec.name.removeprefix("record:"), "event", 1,
                    (tid[rec.agent], _us(rec.start_ns)), (tid[wait.agent], _us(wait.start_ns)))
        fid += 1
    for race in case.races:
        a, b = race.first, race.second
        if a.time_ns is None or b.time_ns is None:
            continue
        # a flow runs forward in time (Perfetto binds flows in time order); in a manifest
        # race the later-issued access ran first, so the arrow starts there
        ends = sorted([(a.time_ns, tid[a.agent]), (b.time_ns, tid[b.agent])])
        ev += _flow(fid, f"{race.kind} {race.buffer}", "race", 1,
                    (ends[0][1], _us(ends[0][0])), (ends[1][1], _us(ends[1][0])))
        fid += 1
    if gpu_timeline:
        ev += _events_for(gpu_timeline, 2, f"gpu: {case.name}")[0]
    return ev


MAX_EVENTS = 2_000_000
"""Events kept in one trace (Perfetto's web UI slows past a few million)."""
GZIP_OVER_BYTES = 8 << 20
"""A trace whose JSON text is larger than this is written gzip-compressed."""


def to_trace(cases: Sequence[CaseResult], max_events: int = MAX_EVENTS) -> dict[str, Any]:
    """One trace document; each case gets its own pair of process ids.

    Past ``max_events`` the remaining cases are left out whole (a case is never cut in the
    middle, its flows would dangle) and ``otherData.note`` says how many.
    """
    events: list[dict] = []
    left_out = 0
    for i, case in enumerate(cases):
        own = trace_events(case)
        if left_out or (events and len(events) + len(own) > max_events):
            left_out += 1
            continue
        for e in own:
            e = dict(e)
            e["pid"] = e["pid"] + 2 * i
            if e["ph"] in ("s", "f"):
                e["id"] = e["id"] + 100_000 * i
            events.append(e)
    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ns"}
    if left_out:
        doc["otherData"] = {"note": f"capped at {max_events} events: the last {left_out} of "
                                    f"{len(cases)} runs are left out; plot or trace them "
                                    "on their own"}
    return doc


def write_trace(cases: Sequence[CaseResult], path: str | Path,
                gzip_over: int = GZIP_OVER_BYTES) -> Path:
    """Write :func:`to_trace` as JSON (open it in ui.perfetto.dev or chrome://tracing).

    Returns the path written: ``path``, or ``path + ".gz"`` when the text is over
    ``gzip_over`` bytes (any stale file of the other name is removed, so a folder never
    holds two traces of different runs).
    """
    text = json.dumps(to_trace(cases), separators=(",", ":"))
    plain, packed = Path(path), Path(f"{path}.gz")
    target, stale = (packed, plain) if len(text) > gzip_over else (plain, packed)
    if target is packed:
        with gzip.open(packed, "wt", compresslevel=1) as f:
            f.write(text)
    else:
        plain.write_text(text)
    stale.unlink(missing_ok=True)
    return target
