"""The predicted-against-measured plot: one panel per metric, one point per run, the diagonal.

Reads plain rows (``{"run_id", "kind", "metrics": {metric: {"predicted", "measured"}}}``, as
``overlap_harness.profile_check`` writes them), so it depends on no result class. Points of
racy runs and race-free runs are told apart by marker; the dashed band is ±10% around the
diagonal, the target of issue 18. Axes are logarithmic when the values span more than two
decades (host stall does), and a run measured or predicted at 0 is left out of a log panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

METRICS = ("iteration_ns", "host_stall_ns", "forward_idle_ns")
BAND = 0.10


def points(rows: Sequence[Mapping[str, Any]], metric: str) -> list[tuple[float, float, str]]:
    """``(measured µs, predicted µs, kind)`` of every row that has ``metric``."""
    out = []
    for r in rows:
        m = r["metrics"].get(metric)
        if m is not None:
            out.append((m["measured"] / 1000, m["predicted"] / 1000, r.get("kind", "")))
    return out


def write_plot(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str) -> Path:
    """Draw the three panels into ``path`` (PNG); returns the path written."""
    path = Path(path)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(5 * len(METRICS), 4.6))
    for ax, metric in zip(axes, METRICS, strict=True):
        pts = points(rows, metric)
        positive = [p for p in pts if p[0] > 0 and p[1] > 0]
        values = [v for p in positive for v in p[:2]]
        log = bool(values) and max(values) / min(values) > 100
        shown = positive if log else pts
        for kind, marker, colour in (("race_free", "o", "tab:blue"), ("racy", "^", "tab:red")):
            sel = [p for p in shown if p[2] == kind]
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], marker=marker, c=colour,
                       s=18, label=f"{kind} ({len(sel)})")
        others = [p for p in shown if p[2] not in ("race_free", "racy")]
        if others:
            ax.scatter([p[0] for p in others], [p[1] for p in others], c="grey", s=18)
        every = [v for p in shown for v in p[:2]] or [0.0, 1.0]
        lo, hi = min(every), max(every)
        lo, hi = (lo / 1.5, hi * 1.5) if log else (0.0, hi * 1.08 or 1.0)
        ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="predicted = measured")
        ax.plot([lo, hi], [lo * (1 + BAND), hi * (1 + BAND)], "k--", lw=0.6, label="±10%")
        ax.plot([lo, hi], [lo * (1 - BAND), hi * (1 - BAND)], "k--", lw=0.6)
        if log:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_title(metric.removesuffix("_ns").replace("_", " "))
        ax.set_xlabel("measured on the GPU (µs)")
        ax.set_ylabel("predicted (µs)")
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
