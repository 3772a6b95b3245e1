"""Overlap metrics computed from a timeline (simulated or measured): the same code for both.

- ``host_stall_ns``: time the host spent blocked in syncs (and blocking copies).
- ``forward_idle_ns``: gaps on the forward stream between its first and last op, the
  bubbles that cost forward occupancy.
- ``iteration_ns``: mean steady-state time per scheduler iteration (first forward op of
  iteration n to that of n+1).
- ``resolve_stall_ns``: the part of the host stall spent getting seq_lens to the host
  (``resolve_seq_lens_cpu``'s D2H-stream sync, blocking ``.cpu()``, or HIP host wait): how
  late the host is released to launch the next forward.
- ``overlap_ratio``: share of the host's own work (scheduling, result processing) that ran
  while the forward stream was busy: host preparation hidden under the forward.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from overlap_harness.model.trace import HOST, OpKind, OpRecord

FORWARD = "forward"
RESOLVE_LABELS = frozenset({"d2h.host_sync", "seq_lens.cpu_sync", "publish_ready.host_wait"})
_BUSY = (OpKind.KERNEL, OpKind.COPY)


@dataclass(frozen=True, slots=True)
class Metrics:
    """Overlap figures of one run, in nanoseconds (see the module docstring)."""

    host_stall_ns: int
    resolve_stall_ns: int
    forward_idle_ns: int
    iteration_ns: int
    overlap_ratio: float
    end_ns: int


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def compute_metrics(timeline: Sequence[OpRecord], forward: str = FORWARD) -> Metrics:
    """Metrics of one run from its timeline."""
    stall = sum(t.end_ns - t.start_ns for t in timeline
                if t.agent == HOST and t.kind == OpKind.HOST_SYNC)
    resolve = sum(t.end_ns - t.start_ns for t in timeline
                  if t.agent == HOST and t.kind == OpKind.HOST_SYNC and t.label in RESOLVE_LABELS)
    fwd = sorted((t for t in timeline if t.agent == forward and t.kind in _BUSY),
                 key=lambda t: t.start_ns)
    busy = _union([(t.start_ns, t.end_ns) for t in fwd])
    idle = sum(b[0] - a[1] for a, b in itertools.pairwise(busy))
    firsts: dict[int, int] = {}
    for t in fwd:
        if t.iteration >= 0:
            firsts.setdefault(t.iteration, t.start_ns)
    its = sorted(firsts)
    steps = [firsts[b] - firsts[a] for a, b in itertools.pairwise(its)]
    iteration = round(sum(steps) / len(steps)) if steps else 0
    work = _union([(t.start_ns, t.end_ns) for t in timeline
                   if t.agent == HOST and t.kind == OpKind.HOST_WORK])
    total_work = sum(e - s for s, e in work)
    ratio = _overlap(work, busy) / total_work if total_work else 0.0
    end = max((t.end_ns for t in timeline), default=0)
    return Metrics(stall, resolve, idle, iteration, round(ratio, 4), end)


def rel_err(predicted: float, measured: float) -> float | None:
    """(predicted - measured) / measured: a model's relative error against a device's figure;
    None when the device measured 0."""
    return None if measured == 0 else (predicted - measured) / measured
