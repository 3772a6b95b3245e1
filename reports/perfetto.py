"""Chrome / Perfetto trace JSON, laid out as torch.profiler users know it.

One process per device (``pid``: the simulated run, and a measured GPU run if given), one
thread per agent (``tid``: host, schedule, forward, d2h, ...), named by ``process_name`` /
``thread_name`` metadata events. Ops are complete slices (``ph: "X"``, ``ts``/``dur`` in
microseconds) with the label, iteration and source line in ``args``; zero-length ops
(records, waits, host reads) are instant events (``ph: "i"``). Flow arrows (``ph: "s"`` then
``"f"`` with one ``id``, both bound to the enclosing slice) join each event record to the
waits bound to it (``cat: "event"``), and the slices of the two accesses of each race
(``cat: "race"``; a zero-length op a flow joins is a one-nanosecond slice, as Perfetto binds
flows to slices only).

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
from overlap_harness.model.trace import OpKind, OpRecord, Race
from overlap_harness.reports.lanes import lane_order, wait_arrows

_INSTANT = (OpKind.RECORD, OpKind.WAIT, OpKind.HOST_READ, OpKind.HOST_WRITE, OpKind.QUERY,
            OpKind.ALLOC, OpKind.FREE)


def _us(ns: int) -> float:
    return ns / 1000.0


FLOW_END_NS = 1
"""Length given to a zero-length op (a record, a wait, a host read) that a flow starts or
ends at: Perfetto binds a flow to the slice open on its track at the flow event's time, and
an instant is never open. One nanosecond never crosses another slice of integer-nanosecond
times."""


def _length(t: OpRecord, flow_ops: frozenset[int]) -> int:
    """Nanoseconds of ``t``'s slice: 0 for an instant; :data:`FLOW_END_NS` for a zero-length
    op in ``flow_ops``."""
    if t.kind not in _INSTANT and t.end_ns > t.start_ns:
        return t.end_ns - t.start_ns
    return FLOW_END_NS if t.op in flow_ops else 0


def _events_for(timeline: Sequence[OpRecord], pid: int, pname: str,
                flow_ops: frozenset[int] = frozenset()
                ) -> tuple[list[dict], dict[str, int], dict[int, tuple[int, float]]]:
    """The metadata and slices of ``timeline``, each agent's thread id, and per op the point
    a flow binds to: its thread and a time inside its slice. Ops in ``flow_ops`` are
    slices even when they take no time (:data:`FLOW_END_NS`)."""
    lanes = lane_order(timeline)
    tid = {a: i + 1 for i, a in enumerate(lanes)}
    ev: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}}]
    ev += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid[a], "args": {"name": a}}
           for a in lanes]
    ev += [{"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid[a],
            "args": {"sort_index": tid[a]}} for a in lanes]
    points: dict[int, tuple[int, float]] = {}
    # slices that start together: the longer first, so the shorter nests in it
    for t in sorted(timeline, key=lambda t: (t.start_ns, -_length(t, flow_ops), t.op)):
        args = {"op": t.op, "iteration": t.iteration, "kind": str(t.kind)}
        if t.label:
            args["label"] = t.label
        if t.source:
            args["source"] = t.source
        base = {"name": t.name, "cat": str(t.kind), "pid": pid, "tid": tid[t.agent],
                "ts": _us(t.start_ns), "args": args}
        length = _length(t, flow_ops)
        if not length:
            ev.append({**base, "ph": "i", "s": "t"})
            continue
        ev.append({**base, "ph": "X", "dur": _us(length)})
        # inside the slice, whole nanoseconds (Perfetto reads times as integer ns)
        points[t.op] = (tid[t.agent], _us(t.start_ns + length // 2))
    return ev, tid, points


def _flow(fid: int, name: str, cat: str, pid: int, a: tuple[int, float],
          b: tuple[int, float], args: dict[str, Any]) -> list[dict[str, Any]]:
    """A flow from point ``a`` to point ``b`` (thread id, time): a flow start binds to the
    slice enclosing it, and so does this end (``bp: "e"``)."""
    return [{"ph": "s", "id": fid, "name": name, "cat": cat, "pid": pid, "tid": a[0],
             "ts": a[1], "args": args},
            {"ph": "f", "bp": "e", "id": fid, "name": name, "cat": cat, "pid": pid,
             "tid": b[0], "ts": b[1], "args": args}]


def race_flow_ends(race: Race) -> tuple[int, int]:
    """The two ops a race's flow joins: its two accesses' ops."""
    return race.first.op, race.second.op


def trace_events(case: CaseResult, gpu_timeline: Sequence[OpRecord] | None = None) -> list[dict]:
    """All trace events of one case: slices, metadata, a flow per record -> wait (the
    bindings the device made, else by name: :func:`reports.lanes.wait_arrows`) and a flow
    per race, between the slices of its two accesses."""
    waits = wait_arrows(case.timeline, case.waits)
    ops = {t.op for t in case.timeline}
    races = [r for r in case.races if all(op in ops for op in race_flow_ends(r))]
    flow_ops = frozenset({op for rec, wait in waits for op in (rec.op, wait.op)}
                         | {op for r in races for op in race_flow_ends(r)})
    ev, _tid, points = _events_for(case.timeline, 1, f"sim: {case.name}", flow_ops)
    fid = 1
    for rec, wait in waits:
        ev += _flow(fid, rec.name.removeprefix("record:"), "event", 1, points[rec.op],
                    points[wait.op], {"record": rec.op, "wait": wait.op})
        fid += 1
    for race in races:
        # a flow runs forward in time (Perfetto draws it from the earlier slice); in a
        # manifest race the later-issued access may have run first
        a, b = sorted((points[op] for op in race_flow_ends(race)), key=lambda p: p[1])
        ev += _flow(fid, f"{race.kind} {race.buffer}", "race", 1, a, b,
                    {"first": race.first.op, "second": race.second.op,
                     "manifest": race.manifest})
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
