"""What a scenario run produces: the records the CLI prints and ``reports`` renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from overlap_harness.model.metrics import Metrics
from overlap_harness.model.trace import OpRecord, QuerySite, Race


@dataclass(slots=True)
class CaseResult:
    """One scenario run (the base run or one mutation) on one device.

    ``verdict`` is what the run computed: "race" when the detector found any race, else
    "fault" when a debug check fired (``faults``), else "race_free"; "error" when the harness
    refused the run (``error``); ``ok`` says whether it matches the
    scenario's expectation, including every race the scenario lists being among those found.
    ``value_diffs`` are the oracle comparison's differences (a manifest race shown as values).
    """

    run_id: str
    scenario: str
    mutation: str
    path: str
    expect: str
    verdict: str
    ok: bool
    races: list[Race] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    value_diffs: list[dict[str, Any]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    metrics: Metrics | None = None
    removed: tuple[str, ...] = ()
    skipped_syncs: list[tuple[str, int]] = field(default_factory=list)
    labels_used: list[str] = field(default_factory=list)  # every sync label the run reached
    uninit_reads: list[str] = field(default_factory=list)  # values set by the allocator
    dup_writes: list[str] = field(default_factory=list)  # scatter order decides the value
    error: str | None = None
    wall_s: float = 0.0  # wall seconds of the run and its oracle (JUnit ``time=``)
    query_sites: list[QuerySite] = field(default_factory=list, repr=False)  # branching queries
    timeline: list[OpRecord] = field(default_factory=list, repr=False)
    # (record op, wait op): the record each wait bound to, as the device bound it (the
    # recorder's); empty: the reports find them by name (reports/lanes.py wait_arrows)
    waits: list[tuple[int, int]] = field(default_factory=list, repr=False)
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def manifest(self) -> bool:
        """A race showed in this run's values or timing."""
        return bool(self.value_diffs) or any(r.manifest for r in self.races)

    @property
    def device_defined(self) -> list[str]:
        """Why some values of this run are the device's choice, not the program's: reads of
        never-written memory and duplicate-index scatters. Such values need not agree
        between the simulator and a GPU even in a race-free run."""
        return self.uninit_reads + self.dup_writes

    @property
    def name(self) -> str:
        """``scenario`` or ``scenario[mutation]``."""
        return f"{self.scenario}[{self.mutation}]" if self.mutation else self.scenario

    def race_keys(self) -> list[str]:
        """Distinct ``"KIND buffer"`` keys found, sorted."""
        return sorted({r.key for r in self.races})
