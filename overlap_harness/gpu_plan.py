"""The simulator's side of the GPU replay: what each run of the suite should show on a GPU.

For every :class:`scenarios.expand.RunSpec`, :func:`plan_spec` runs the protocol on
``SimDevice`` and returns a :class:`Plan`: the sim verdict, the serial oracle's values, the
overlapped run's values and metrics and, for a racy run, a *GPU schedule* (injected delays)
with the values the simulator predicts under it.

Why a schedule differs from exploration's: exploration shrinks to the smallest delays that make
a race manifest in the model (tens of µs), but a GPU's host launches an op in 20-100 µs and its
clocks wander, so a 30 µs inversion is a coin toss there. The schedule is therefore

1. exploration's shrunk delays (found with the value-level criterion: the values differ from
   the oracle), each raised to at least ``floor_us`` (:func:`scale_delays`);
2. then *widened*: every racing pair whose two accesses are closer than ``min_gap_us`` in the
   simulated run gets its later access's op delayed until they are that far apart, a few rounds
   (:func:`widen`). A device read counts over its op's whole span, since CudaDevice's kernels
   read after their cost sleep while the simulator reads at the op's start.

Every simulation here uses ``host_launch_us`` (the GPU's measured launch cost, when known) and
no jitter: the GPU has its own. Plans are plain picklable data, so a process pool builds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from model.config import Expect, Scenario
from model.errors import HarnessError
from model.metrics import Metrics, compute_metrics
from model.protocol import ProtocolOutcome, compare_runs
from model.trace import HOST, DeviceRun, OpRecord, Race
from overlap_harness.explore import Trial as ExploreTrial
from overlap_harness.explore import explore
from overlap_harness.runner import simulate
from scenarios.expand import RunSpec

Delays = dict[tuple[str, int], float]
FLOOR_US = 2000.0
MIN_GAP_US = 300.0
WIDEN_ROUNDS = 4


@dataclass(slots=True)
class Values:
    """Everything a run read: the host-side outcome and the observed device reads."""

    outcome: ProtocolOutcome
    observations: dict[tuple[str, int], list[Any]]


@dataclass(slots=True)
class SimView:
    """One simulated run: its values, races, verdict and metrics."""

    values: Values
    races: list[Race]
    verdict: str
    metrics: Metrics


@dataclass(slots=True)
class Plan:
    """What the GPU replay of one run checks against (see the module docstring).

    ``kind`` is ``"race_free"`` (the detector finds no race; a fault run is one too: its
    values must still agree), ``"racy"`` or ``"error"`` (the harness refuses the run).
    ``predicted`` is the simulated run under ``delays`` (racy runs only) and
    ``predicted_diffs`` its differences from the oracle, one line each.
    """

    spec: RunSpec
    scenario: Scenario
    host_launch_us: float
    kind: str
    sim_verdict: str
    error: str | None = None
    oracle: Values | None = None
    sim: SimView | None = None
    sim_as_written: Metrics | None = None
    explore_delays: Delays | None = None
    schedule_source: str = ""
    delays: Delays = field(default_factory=dict)
    predicted: SimView | None = None
    predicted_diffs: list[str] = field(default_factory=list)
    tight_left: int = 0


def verdict_of(races: list[Race], outcome: ProtocolOutcome) -> str:
    """The runner's verdict rule: race if any race, else fault if a debug check fired."""
    if races:
        return str(Expect.RACE)
    return str(Expect.FAULT) if outcome.debug_failures else str(Expect.RACE_FREE)


def scale_delays(delays: Mapping[tuple[str, int], float], floor_us: float = FLOOR_US,
                 factor: float = 1.0) -> Delays:
    """Each delay times ``factor``, and at least ``floor_us``: far apart on any GPU."""
    return {k: max(v * factor, floor_us) for k, v in delays.items()}


def with_launch(scenario: Scenario, spec: RunSpec, host_launch_us: float | None) -> Scenario:
    """The spec's scenario (mutation's protocol applied), with the host launch cost replaced."""
    sc = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    if host_launch_us is None:
        return sc
    timing = dataclasses.replace(sc.timing, host_launch=host_launch_us)
    return dataclasses.replace(sc, timing=timing)


def sim_run(scenario: Scenario, removed: frozenset[str], delays: Mapping | None = None,
            ) -> tuple[SimView, DeviceRun]:
    """The overlapped run on SimDevice without jitter; its view and raw run."""
    outcome, dev = simulate(scenario, removed, delays=delays, jitter=0.0)
    run = dev.finish()
    values = Values(outcome, dict(dev.observations))
    view = SimView(values, run.races, verdict_of(run.races, outcome),
                   compute_metrics(run.timeline))
    return view, run


def oracle_run(scenario: Scenario, removed: frozenset[str]) -> Values:
    """The serial oracle's values."""
    outcome, dev = simulate(scenario, removed, serial=True)
    dev.finish()
    return Values(outcome, dict(dev.observations))


def diffs(a: Values, b: Values) -> list[str]:
    """``compare_runs`` of two runs' values, one line per first difference."""
    return [d.describe() for d in compare_runs(a.outcome, a.observations,
                                               b.outcome, b.observations)]


def _window(rec: OpRecord, mode: str) -> tuple[int, int]:
    """When an access may take effect: a device read over its op's span (the GPU reads after
    its cost sleep, the simulator at the start), a write at the op's end, a host access at once."""
    if rec.agent == HOST:
        return rec.start_ns, rec.end_ns
    return (rec.start_ns, rec.end_ns) if mode == "read" else (rec.end_ns, rec.end_ns)


def tight_pairs(run: DeviceRun, min_gap_us: float = MIN_GAP_US) -> list[tuple[Race, float]]:
    """Racing pairs whose access windows are closer than ``min_gap_us``, each with the delay
    (µs) its later-taking-effect access's op needs to be that far behind; 0 when that access
    is the host's (it cannot be delayed)."""
    recs = {t.op: t for t in run.timeline}
    out = []
    gap_ns = min_gap_us * 1000
    for r in run.races:
        a, b = recs.get(r.first.op), recs.get(r.second.op)
        if a is None or b is None:
            continue
        wa, wb = _window(a, r.first.mode), _window(b, r.second.mode)
        (early, _), (late, late_acc) = ((wa, r.first), (wb, r.second)) if not r.manifest \
            else ((wb, r.second), (wa, r.first))
        need_ns = early[1] + gap_ns - late[0]
        if need_ns > 0:
            movable = late_acc.agent != HOST
            out.append((r, need_ns / 1000 if movable else 0.0))
    return out


def widen(scenario: Scenario, removed: frozenset[str], delays: Delays, oracle: Values,
          min_gap_us: float = MIN_GAP_US, rounds: int = WIDEN_ROUNDS,
          ) -> tuple[Delays, SimView, int]:
    """Delay the later access of every tight racing pair (see the module docstring) while the
    prediction keeps its manifest status; returns the delays, their run, the pairs left tight."""
    view, run = sim_run(scenario, removed, delays)
    manifest = bool(diffs(view.values, oracle))
    tight = tight_pairs(run, min_gap_us)
    for _ in range(rounds):
        extra: Delays = {}
        for r, need in tight:
            if need > 0:
                acc = r.first if r.manifest else r.second
                key = (acc.op_name, acc.iteration)
                extra[key] = max(extra.get(key, 0.0), need)
        if not extra:
            break
        cand = {k: delays.get(k, 0.0) + extra.get(k, 0.0) for k in delays.keys() | extra.keys()}
        cview, crun = sim_run(scenario, removed, cand)
        if bool(diffs(cview.values, oracle)) != manifest:
            break  # widening would change what the schedule shows: keep the last one
        delays, view, run = cand, cview, crun
        tight = tight_pairs(run, min_gap_us)
    return delays, view, len(tight)


def _value_explore(scenario: Scenario, removed: frozenset[str], oracle: Values,
                   budget: int) -> tuple[Delays | None, str]:
    """Exploration with the value-level criterion; (shrunk delays or None, source)."""
    def trial(delays: Mapping, jitter: float, seed: int) -> ExploreTrial:
        outcome, dev = simulate(scenario, removed, delays=delays, jitter=jitter, seed=seed)
        run = dev.finish()
        got = Values(outcome, dict(dev.observations))
        return ExploreTrial(run.races, bool(diffs(got, oracle)))

    ex = explore(trial, budget=budget, seed=scenario.check.seed)
    return ex.shrunk, ex.source or "none"


def plan_spec(spec: RunSpec, host_launch_us: float | None = None, floor_us: float = FLOOR_US,
              min_gap_us: float = MIN_GAP_US, explore_budget: int = 32) -> Plan:
    """Simulate one run and, if racy, choose its GPU schedule and predict its values."""
    sc = with_launch(spec.scenario, spec, host_launch_us)
    launch = sc.timing.host_launch
    try:
        view, _run = sim_run(sc, spec.removed)
        oracle = oracle_run(sc, spec.removed)
        written, _ = sim_run(with_launch(spec.scenario, spec, None), spec.removed)
    except HarnessError as exc:
        return Plan(spec, sc, launch, "error", str(Expect.ERROR), error=str(exc))
    plan = Plan(spec, sc, launch, "racy" if view.races else "race_free", view.verdict,
                oracle=oracle, sim=view, sim_as_written=written.metrics)
    if plan.kind == "race_free":
        return plan
    shrunk, source = _value_explore(sc, spec.removed, oracle, explore_budget)
    plan.explore_delays, plan.schedule_source = shrunk, source
    start = scale_delays(shrunk or {}, floor_us)
    if start:  # the raised delays must still show wrong values, else keep exploration's
        raised, _ = sim_run(sc, spec.removed, start)
        if not diffs(raised.values, oracle):
            start = dict(shrunk or {})
            plan.schedule_source += " (unscaled)"
    plan.delays, plan.predicted, plan.tight_left = widen(sc, spec.removed, start, oracle,
                                                         min_gap_us)
    plan.predicted_diffs = diffs(plan.predicted.values, oracle)
    return plan
