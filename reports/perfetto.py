"""Chrome / Perfetto trace JSON, laid out as torch.profiler users know it.

One process per device (``pid``: the simulated run, and a measured GPU run if given), one
thread per agent (``tid``: host, schedule, forward, d2h, ...), named by ``process_name`` /
``thread_name`` metadata events. Ops are complete slices (``ph: "X"``, ``ts``/``dur`` in
microseconds) with the label, iteration and source line in ``args``; zero-length ops
(records, waits, host reads) are instant events (``ph: "i"``). Flow arrows (``ph: "s"`` then
``"f"`` with one ``id``) join each event record to the waits bound to it, and the two
accesses of each race (``cat: "race"``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from model.results import CaseResult
from model.trace import OpKind, OpRecord
from reports.timeline import event_arrows, lane_order

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


def to_trace(cases: Sequence[CaseResult]) -> dict[str, Any]:
    """One trace document; each case gets its own pair of process ids."""
    events: list[dict] = []
    for i, case in enumerate(cases):
        for e in trace_events(case):
            e = dict(e)
            e["pid"] = e["pid"] + 2 * i
            if e["ph"] in ("s", "f"):
                e["id"] = e["id"] + 100_000 * i
            events.append(e)
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(cases: Sequence[CaseResult], path: str) -> None:
    """Write :func:`to_trace` as JSON (open it in ui.perfetto.dev or chrome://tracing)."""
    with open(path, "w") as f:
        json.dump(to_trace(cases), f)
