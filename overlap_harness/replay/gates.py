"""Gates: the order a simulated run gave every conflicting pair of accesses, for a GPU to keep.

Timed delays (``torch.cuda._sleep``) make a race manifest on a GPU only while the model's
timing error stays below the gaps they open. Four suite runs on an H200 (2026-11-21, the
dry runs under ``reports/gpu/dry-runs/``) showed where that fails: a run whose delayed
prediction inverts dozens of racing pairs (the ``forward_entry`` removals: 60 in
s10), or one whose racing pair spans an iteration of host time (the GPU's host is ~30% slower
than the model's), executes some pair in the other order, and from there its values diverge.

A *gate* removes the timing from the question. For each conflicting pair of accesses on
different agents that the run does not order by happens-before, the earlier one (by the
simulated time of the access: a read at its op's start, a write at its op's end, and writes
before reads at one instant, as ``SimDevice`` applies them) is made to finish before the
later op does its work: on CUDA a stream waits on a flag in pinned memory
(``cuStreamWaitValue32``) that the earlier op sets when it ends (``cuStreamWriteValue32``, or a
plain store when the host did it); the host polls a flag when the later access is its own.
The device's trace never sees a gate (they are not the program's syncs), so its detector
still reports the race; the gates only fix which side of it runs first, to the side the
model predicted.

Only the latest conflicting access per other agent is gated (an agent's earlier accesses
finish before its later ones: stream FIFO, host program order), and only when it does not
happen before the later one. The gates plus the run's happens-before edges must be acyclic
to be executable; where the simulation overlapped two ops that a GPU runs as a unit (a read
at one op's start against a write at the other's end, both ways), a gate closing a cycle is
dropped and counted. Ops are named across devices by :data:`OpKey`: agent, op name,
iteration and the occurrence of that triple in issue order (both devices run one program).
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
import numpy as np

from overlap_harness.model.detector import HBDetector
from overlap_harness.model.opkeys import ACCESS_KINDS, Gate, KeyCounter, OpKey
from overlap_harness.model.trace import OpRecord


def op_keys(timeline: Sequence[OpRecord]) -> dict[int, OpKey]:
    """The key of every op that can access memory, by op id."""
    counter = KeyCounter()
    return {r.op: counter.key(r.agent, r.name, r.iteration)
            for r in sorted(timeline, key=lambda r: r.op) if r.kind in ACCESS_KINDS}


def gate_pairs(det: HBDetector, timeline: Sequence[OpRecord]) -> tuple[list[Gate], int]:
    """The gates that hold a device to this run's order of racing accesses, and how many were
    dropped to keep them executable (see the module docstring)."""
    rec = {r.op: r for r in timeline}
    events: list[tuple[int, int, int, int, np.ndarray, bool]] = []
    for op, accs in enumerate(det.node_accesses):
        r = rec.get(op)
        if r is None or r.kind not in ACCESS_KINDS:
            continue
        for a in accs:
            t = r.end_ns if a.write else r.start_ns
            events.append((t, 0 if a.write else 1, op, a.storage, a.elements.ravel(), a.write))
    events.sort(key=lambda e: e[:3])
    numel: dict[int, int] = {}
    for e in events:
        if e[4].size:
            numel[e[3]] = max(numel.get(e[3], 0), int(e[4].max()) + 1)
    n_agents = len(det.agent_names)
    last_w: dict[int, np.ndarray] = {}
    last_any: dict[int, np.ndarray] = {}
    pairs: set[tuple[int, int]] = set()
    for i, (_t, _o, op, storage, elems, write) in enumerate(events):
        if elems.size == 0:
            continue
        if storage not in last_w:
            last_w[storage] = np.full((numel[storage], n_agents), -1, dtype=np.int64)
            last_any[storage] = np.full((numel[storage], n_agents), -1, dtype=np.int64)
        agent = det.nodes[op].agent
        table = last_any[storage] if write else last_w[storage]
        latest = table[elems].max(axis=0)
        for other in range(n_agents):
            j = int(latest[other])
            if other == agent or j < 0:
                continue
            p = events[j][2]
            if p != op and not det.happens_before(p, op):
                pairs.add((p, op))
        last_any[storage][elems, agent] = i
        if write:
            last_w[storage][elems, agent] = i
    kept, dropped = _acyclic(det, pairs)
    keys = op_keys(timeline)
    return sorted((keys[p], keys[q]) for p, q in kept), dropped


def _acyclic(det: HBDetector, pairs: set[tuple[int, int]]) -> tuple[set[tuple[int, int]], int]:
    """Drop gates until gates plus happens-before edges form a DAG; (kept, dropped)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(det.nodes)))
    g.add_edges_from(det.edges)
    g.add_edges_from(pairs, gate=True)
    kept, dropped = set(pairs), 0
    while True:
        try:
            cycle = nx.find_cycle(g)
        except nx.NetworkXNoCycle:
            return kept, dropped
        u, v = next((u, v) for u, v, *_ in cycle if (u, v) in kept)
        g.remove_edge(u, v)
        kept.discard((u, v))
        dropped += 1
