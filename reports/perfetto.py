"""Chrome/Perfetto trace JSON, in the layout torch.profiler (Kineto) users already know.

Open ``trace.json`` in https://ui.perfetto.dev or chrome://tracing. Layout:

- one process per (device, case): integer ``pid``; its ``process_name`` metadata is
  ``"sim: scenario[mutation]"`` (``"gpu: ..."`` for a measured run), like Kineto's "GPU 0";
- one thread per agent: integer ``tid``; ``thread_name`` is the agent (host, schedule,
  forward, d2h, ...), ordered by ``thread_sort_index`` as in the timeline plot;
- every op is an ``"X"`` complete slice, ``ts``/``dur`` in microseconds, ``cat`` its kind,
  ``args`` its label, iteration, source line, op id and issue time;
- flows (``"s"`` then ``"f"`` with ``bp: "e"``, matching ``id``) go from each event record to
  the wait that consumed it (``cat: "event"``) and from the first to the second access of
  each race (``cat: "race"``, ``args.report`` the race report), so a click on a racing
  kernel shows its partner. Viewers bind flows in time order, so a flow points from the
  earlier slice to the later one: for a manifest race that is second -> first.

A track must hold slices that do not partly overlap. Ops of one stream never do in the sim;
a measured timeline might (clock skew), so an op that would overlap its predecessor goes to an
overflow thread ``"<agent> (2)"`` instead of producing a trace the viewer rejects.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.results import CaseResult
from model.trace import OpRecord, Race
from reports.timeline import event_arrows, lane_order


def _us(ns: int) -> float:
    return ns / 1000.0


@dataclass(slots=True)
class _Process:
    """Builds the events of one process (one case on one device)."""

    pid: int
    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    tids: dict[str, int] = field(default_factory=dict)  # track name -> tid
    track_end: dict[str, int] = field(default_factory=dict)  # track name -> last end (ns)
    slice_at: dict[int, tuple[int, int]] = field(default_factory=dict)  # op -> (tid, ts ns)
    flow_ids: list[int] = field(default_factory=lambda: [0])

    def tid(self, track: str) -> int:
        if track not in self.tids:
            self.tids[track] = len(self.tids) + 1
            self.events.append({"name": "thread_name", "ph": "M", "pid": self.pid,
                                "tid": self.tids[track], "args": {"name": track}})
            self.events.append({"name": "thread_sort_index", "ph": "M", "pid": self.pid,
                                "tid": self.tids[track],
                                "args": {"sort_index": self.tids[track]}})
        return self.tids[track]

    def add_op(self, t: OpRecord, source_tag: str) -> None:
        track, k = t.agent, 1
        while self.track_end.get(track, -1) > t.start_ns:
            k += 1
            track = f"{t.agent} ({k})"
        self.track_end[track] = max(t.end_ns, t.start_ns)
        tid = self.tid(track)
        self.slice_at[t.op] = (tid, t.start_ns)
        args: dict[str, Any] = {"op": int(t.op), "kind": str(t.kind), "iteration": t.iteration,
                                "source": t.source, "issue_us": _us(t.issue_ns),
                                "device": source_tag}
        if t.label is not None:
            args["label"] = t.label
        self.events.append({"name": t.name, "cat": str(t.kind), "ph": "X", "pid": self.pid,
                            "tid": tid, "ts": _us(t.start_ns),
                            "dur": _us(max(0, t.end_ns - t.start_ns)), "args": args})

    def add_flow(self, name: str, cat: str, src: int, dst: int,
                 args: dict[str, Any] | None = None, at: tuple[int, int] | None = None) -> None:
        """A flow from op ``src``'s slice to op ``dst``'s (``at`` overrides the two times)."""
        if src not in self.slice_at or dst not in self.slice_at:
            return
        (tid_a, ts_a), (tid_b, ts_b) = self.slice_at[src], self.slice_at[dst]
        if at is not None:
            ts_a, ts_b = at
        if ts_b < ts_a:  # viewers bind flows in time order: point from the earlier access
            (tid_a, ts_a), (tid_b, ts_b) = (tid_b, ts_b), (tid_a, ts_a)
        flow_id = self.pid * 1_000_000 + self.flow_ids[0]
        self.flow_ids[0] += 1
        common = {"name": name, "cat": cat, "id": flow_id, "pid": self.pid}
        start = {**common, "ph": "s", "tid": tid_a, "ts": _us(ts_a)}
        if args:
            start["args"] = args
        self.events.append(start)
        self.events.append({**common, "ph": "f", "bp": "e", "tid": tid_b, "ts": _us(ts_b)})


def _race_times(race: Race, by_op: dict[int, OpRecord]) -> tuple[int, int] | None:
    """Flow times inside each access's slice: the op's start (the slice holds it)."""
    a, b = by_op.get(race.first.op), by_op.get(race.second.op)
    if a is None or b is None:
        return None
    return a.start_ns, b.start_ns


def process_events(pid: int, name: str, timeline: Sequence[OpRecord],
                   races: Sequence[Race] = (), device: str = "sim") -> list[dict[str, Any]]:
    """Trace events of one timeline: metadata, slices, event flows, race flows."""
    proc = _Process(pid, name)
    proc.events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
    proc.events.append({"name": "process_sort_index", "ph": "M", "pid": pid,
                        "args": {"sort_index": pid}})
    for agent in lane_order(timeline):  # tids in lane order, before overflow tracks
        proc.tid(agent)
    for t in sorted(timeline, key=lambda t: (t.start_ns, t.op)):
        proc.add_op(t, device)
    for rec, wait in event_arrows(timeline):
        proc.add_flow(rec.name[len("record:"):], "event", rec.op, wait.op)
    by_op = {t.op: t for t in timeline}
    for race in races:
        at = _race_times(race, by_op)
        if at is not None:
            proc.add_flow(f"race {race.key}", "race", race.first.op, race.second.op,
                          {"report": race.describe()}, at)
    return proc.events


def to_trace(results: Sequence[CaseResult],
             gpu: dict[str, Sequence[OpRecord]] | None = None) -> dict[str, Any]:
    """The trace document: one sim process per case, plus measured runs keyed by run_id."""
    events: list[dict[str, Any]] = []
    pid = 0
    for r in results:
        pid += 1
        events += process_events(pid, f"sim: {r.name}", r.timeline, r.races, "sim")
        if gpu and r.run_id in gpu:
            pid += 1
            events += process_events(pid, f"gpu: {r.name}", gpu[r.run_id], (), "gpu")
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "overlap-harness",
                          "cases": [r.run_id for r in results]}}


def write_trace(results: Sequence[CaseResult], path: str | Path,
                gpu: dict[str, Sequence[OpRecord]] | None = None) -> Path:
    """Write :func:`to_trace` as compact JSON to ``path``."""
    path = Path(path)
    path.write_text(json.dumps(to_trace(results, gpu), separators=(",", ":")) + "\n")
    return path
