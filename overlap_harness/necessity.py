"""Which syncs of a scenario are necessary: remove each label it uses, one at a time.

A sync is necessary when removing it makes the detector find a race (its kinds and buffers
are listed), redundant when the run stays race-free. The cost columns say what the sync costs
when kept (host stall and forward idle it adds over the run without it).
"""

from __future__ import annotations

from dataclasses import dataclass

from overlap_harness.model.config import Expect, Scenario
from overlap_harness.model.metrics import Metrics, compute_metrics
from overlap_harness.runner import simulate


@dataclass(frozen=True, slots=True)
class NecessityRow:
    """One sync label of one scenario, removed."""

    scenario: str
    label: str
    necessary: bool
    races: tuple[str, ...]
    manifest: bool
    stall_saved_ns: int
    idle_saved_ns: int


def _metrics(sc: Scenario, removed: frozenset[str]) -> tuple[Metrics, list, set[str]]:
    _, dev = simulate(sc, removed)
    run = dev.finish()
    return compute_metrics(run.timeline), run.races, dev.labels_used


def necessity(sc: Scenario) -> list[NecessityRow]:
    """Remove each sync label the base run uses, in turn (the base run must be race-free)."""
    base, races, labels = _metrics(sc, frozenset())
    if races:
        return []
    rows = []
    for label in sorted(labels):
        m, rs, _ = _metrics(sc, frozenset({label}))
        rows.append(NecessityRow(
            sc.name, label, bool(rs), tuple(sorted({r.key for r in rs})),
            any(r.manifest for r in rs),
            base.host_stall_ns - m.host_stall_ns, base.forward_idle_ns - m.forward_idle_ns,
        ))
    return rows


def race_free_base(sc: Scenario) -> bool:
    """Necessity is defined on scenarios whose base run expects no race."""
    return sc.check.expect == Expect.RACE_FREE


__all__ = ["NecessityRow", "necessity", "race_free_base"]
