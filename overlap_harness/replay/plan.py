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
2. then *widened*: every racing pair the schedule inverts (its race is manifest in the
   simulated run under the delays, taken anew each round: a delay also pushes later
   iterations' ops and can invert more pairs) whose two accesses are closer than a margin gets
   its later access's op (the held-back one) delayed until they are that far apart, a few
   rounds (:func:`widen`). Pairs the schedule leaves in issue order keep their
   gaps: widening those too (the 2026-11-21 wide-gaps run) added many ms of delays over the
   iterations and cost runs that had matched with narrow gaps. Widening only the pairs the
   *starting* schedule inverted (the 2026-11-21 inverted-pairs run) left the pairs inverted
   later by the delays' knock-on (down to overlapping windows) close: 10/40 runs missed,
   every one of them with such a pair. A device read counts over its
   op's whole span, since CudaDevice's kernels read after their cost sleep while the simulator
   reads at the op's start.

The margin has to dominate the model's timing error, not the launch jitter: on an H200 a
simulated iteration ran ~30% shorter than the GPU's (the host spends ~200 µs an op), so a
300 µs gap closed on the GPU and it executed the racing pair in the oracle's order (the
2026-11-21 dry run: 17/40 racy runs at target). A pair's margin (:func:`pair_margin_ns`) is the
largest of ``GAP_FLOOR_US``, ``GAP_ITER_SHARE`` of the run's simulated iteration time
(:func:`margin_us`) and ``GAP_DRIFT_SHARE`` of the host time between the two accesses' issue
(the error grows with it). When the full widening would make the prediction lose its wrong
values, the largest fraction of it that keeps them is kept (bisection) and the ops are
recorded in ``Plan.capped``, so the report says which pairs stayed closer than the margin.

A racy run is judged on its exact values (``EXACT``) unless they are partly the device's
(:func:`racy_class`): the delayed prediction reads never-written memory or scatters an element
twice (its ``predicted_uninit_reads`` / ``predicted_dup_writes``). Those runs are
"manifest-only": a trial counts when it differs from the oracle at exactly the places the
prediction does (:func:`diff_keys`), whatever the values there. A reuse race is judged
exactly: the GPU's block pool (:mod:`model.allocator`) hands a freed block to the owner
the simulator does (with torch's caching allocator the owner, and so the values, varied from
trial to trial: s16's keep-alive mutation scored 1/20 at the predicted places in one run).

Every simulation here uses ``host_launch_us`` (the GPU's measured launch cost, when known) and
no jitter: the GPU has its own. Plans are plain picklable data, so a process pool builds them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.explore import Trial as ExploreTrial
from overlap_harness.explore import explore
from overlap_harness.model.config import Expect, Scenario
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import Metrics, compute_metrics
from overlap_harness.model.opkeys import Gate
from overlap_harness.model.protocol import ProtocolOutcome, compare_runs
from overlap_harness.model.trace import HOST, DeviceRun, OpRecord, Race
from overlap_harness.replay.gates import gate_pairs
from overlap_harness.runner import simulate
from overlap_harness.scenarios.expand import RunSpec

Delays = dict[tuple[str, int], float]
FLOOR_US = 2000.0
GAP_FLOOR_US = 3000.0  # the smallest margin between two racing accesses
GAP_ITER_SHARE = 0.75  # ... and at least this share of the simulated iteration time
GAP_DRIFT_SHARE = 0.75  # ... and of the host time between the two accesses' issue
MIN_GAP_US = GAP_FLOOR_US  # the margin when the run's iteration time is not known
WIDEN_ROUNDS = 6
BACKOFF_STEPS = 6


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
    ``predicted_diffs`` its differences from the oracle, one line each. ``margin_us`` is the
    widening margin, ``narrowest_gap_us`` the smallest gap between two racing accesses in the
    prediction (negative: overlapping windows), ``tight_left`` the pairs still closer than
    their margin and ``capped`` the ops whose widening was cut short to keep the wrong values.
    ``uninit_reads`` (from the undelayed simulation) lists reads of never-written memory: the
    values there are the allocator's, so a GPU run's cannot be compared bit for bit;
    ``dup_writes`` lists ops writing an element twice (the scatter order decides the value).
    ``predicted_uninit_reads``, ``predicted_dup_writes`` and ``predicted_race_kinds`` are the
    same of the delayed prediction (racy runs), which :attr:`match_class` judges by;
    ``inverted_pairs`` counts the races the schedule inverts (the pairs widened). ``gates``
    hold a device to the prediction's order of every racing pair
    (:mod:`overlap_harness.replay.gates`),
    ``gates_dropped`` counts those left out to keep them executable.
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
    margin_us: float = 0.0
    narrowest_gap_us: float | None = None
    capped: list[str] = field(default_factory=list)
    uninit_reads: list[str] = field(default_factory=list)
    dup_writes: list[str] = field(default_factory=list)
    predicted_uninit_reads: list[str] = field(default_factory=list)
    predicted_dup_writes: list[str] = field(default_factory=list)
    predicted_race_kinds: list[str] = field(default_factory=list)
    inverted_pairs: int = 0
    gates: list[Gate] = field(default_factory=list)
    gates_dropped: int = 0

    @property
    def values_class(self) -> str:
        """:func:`values_class` of this plan's undelayed simulation."""
        return values_class(self.uninit_reads, self.dup_writes)

    @property
    def match_class(self) -> str:
        """Racy runs: :func:`racy_class` of the delayed prediction; ``""`` otherwise."""
        if self.kind != "racy":
            return ""
        return racy_class(self.predicted_uninit_reads, self.predicted_dup_writes)


ALLOCATOR_DEPENDENT = "allocator-dependent: values not compared"
SCATTER_DEPENDENT = "scatter-order-dependent: values not compared"
DETERMINISTIC = "deterministic"


def values_class(uninit_reads: list[str], dup_writes: list[str]) -> str:
    """Whether a run's values are the program's alone (``DETERMINISTIC``), or partly the
    device's: read from never-written memory (the caching allocator decides which old
    contents a block holds) or written twice by one scatter (the order is the device's).
    A race-free run of the second kind need not agree bit for bit with the simulator."""
    if uninit_reads:
        return ALLOCATOR_DEPENDENT
    return SCATTER_DEPENDENT if dup_writes else DETERMINISTIC


EXACT = "exact"
MANIFEST_ONLY = "manifest-only"


def racy_class(uninit_reads: list[str], dup_writes: list[str]) -> str:
    """How a racy run's trials are judged: ``EXACT`` (every value the prediction's) when the
    delayed prediction's values are the program's alone, else ``"manifest-only: <reason>"``
    (the wrong values at exactly the prediction's places, :func:`diff_keys`): it reads
    never-written memory or scatters an element twice. A reuse race alone is judged exactly
    (see the module docstring)."""
    why = []
    if uninit_reads:
        why.append("reads never-written memory")
    if dup_writes:
        why.append("duplicate-index scatter")
    return f"{MANIFEST_ONLY}: " + ", ".join(why) if why else EXACT


def predicted_class(scenario: Scenario, removed: frozenset[str],
                    delays: Mapping[tuple[str, int], float]) -> str:
    """:func:`racy_class` of the simulated run under ``delays`` (what a racy plan's
    ``match_class`` is, recomputed from its schedule)."""
    _view, run = sim_run(scenario, removed, delays)
    return run_class(run)


def run_class(run: DeviceRun) -> str:
    """:func:`racy_class` of a simulated (delayed) run."""
    return racy_class(*_device_defined(run))


def _device_defined(run: DeviceRun) -> tuple[list[str], list[str]]:
    return (list(getattr(run, "uninit_reads", []) or []),
            list(getattr(run, "dup_writes", []) or []))


def device_defined(scenario: Scenario, removed: frozenset[str]) -> tuple[list[str], list[str]]:
    """The undelayed simulation's uninit reads and duplicate-index writes (see
    :func:`values_class`); empty lists for a simulator that does not track them."""
    _view, run = sim_run(scenario, removed)
    return _device_defined(run)


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


def diff_keys(a: Values, b: Values) -> list[tuple[str, int, str | None]]:
    """Where ``a`` differs from ``b`` (the values left out): per first difference, what
    differs (a token list, an observed op's read), its iteration and its request. The
    manifest-only criterion holds a trial's keys against the prediction's."""
    return sorted({(d.key, d.iteration, d.request)
                   for d in compare_runs(a.outcome, a.observations, b.outcome, b.observations)},
                  key=repr)


RaceId = tuple[str, str, str, int, str, int]


def race_id(r: Race) -> RaceId:
    """A race across runs of one scenario: kind, buffer, both accesses' ops."""
    return (str(r.kind), r.buffer, r.first.op_name, r.first.iteration, r.second.op_name,
            r.second.iteration)


def inverted(run: DeviceRun) -> frozenset[RaceId]:
    """The races this run executes against their issue order (manifest): under a schedule,
    the pairs its delays invert, the only ones :func:`widen` moves apart."""
    return frozenset(race_id(r) for r in run.races if r.manifest)


def _window(rec: OpRecord, mode: str) -> tuple[int, int]:
    """When an access may take effect: a device read over its op's span (the GPU reads after
    its cost sleep, the simulator at the start), a write at the op's end, a host access at once."""
    if rec.agent == HOST:
        return rec.start_ns, rec.end_ns
    return (rec.start_ns, rec.end_ns) if mode == "read" else (rec.end_ns, rec.end_ns)


def margin_us(metrics: Metrics, floor_us: float = GAP_FLOOR_US,
              share: float = GAP_ITER_SHARE) -> float:
    """The widening margin of a run: ``floor_us``, or ``share`` of its simulated iteration
    time when that is larger (see the module docstring)."""
    return max(floor_us, share * metrics.iteration_ns / 1000)


def pair_margin_ns(a: OpRecord, b: OpRecord, min_gap_us: float,
                   drift_share: float = GAP_DRIFT_SHARE) -> float:
    """The gap two racing accesses' ops need: ``min_gap_us``, or ``drift_share`` of the host
    time between their issues when that is larger."""
    return max(min_gap_us * 1000, drift_share * abs(b.issue_ns - a.issue_ns))


def pair_gaps(run: DeviceRun, min_gap_us: float = MIN_GAP_US,
              drift_share: float = GAP_DRIFT_SHARE, only: frozenset[RaceId] | None = None,
              ) -> list[tuple[Race, float, float]]:
    """Every racing pair with both ops on the timeline (of the races in ``only``, when
    given), as (race, gap, margin) in µs: the gap from the access that takes effect first (in
    this run's order) to the other one's start, negative when their windows overlap."""
    recs = {t.op: t for t in run.timeline}
    out = []
    for r in run.races:
        if only is not None and race_id(r) not in only:
            continue
        a, b = recs.get(r.first.op), recs.get(r.second.op)
        if a is None or b is None:
            continue
        wa, wb = _window(a, r.first.mode), _window(b, r.second.mode)
        early, late = (wa, wb) if not r.manifest else (wb, wa)
        out.append((r, (late[0] - early[1]) / 1000,
                    pair_margin_ns(a, b, min_gap_us, drift_share) / 1000))
    return out


def tight_pairs(run: DeviceRun, min_gap_us: float = MIN_GAP_US,
                drift_share: float = GAP_DRIFT_SHARE, only: frozenset[RaceId] | None = None,
                ) -> list[tuple[Race, float]]:
    """Racing pairs (of the races in ``only``, when given) whose access windows are closer
    than their margin (:func:`pair_margin_ns`), each with the delay (µs) its
    later-taking-effect access's op needs to be that far behind; 0 when that access is the
    host's (it cannot be delayed)."""
    out = []
    for r, gap, margin in pair_gaps(run, min_gap_us, drift_share, only):
        if gap < margin:
            late_acc = r.first if r.manifest else r.second
            out.append((r, margin - gap if late_acc.agent != HOST else 0.0))
    return out


@dataclass(slots=True)
class Widened:
    """The outcome of :func:`widen`."""

    delays: Delays
    view: SimView
    run: DeviceRun
    tight_left: int
    capped: list[str] = field(default_factory=list)
    targets: frozenset[RaceId] = frozenset()


def _status(view: SimView, run: DeviceRun, oracle: Values) -> tuple[bool, bool]:
    """What a schedule must keep while it is raised and widened: whether its values are
    wrong, and whether they are the program's alone (no never-written read, no duplicate
    scatter; an exact prediction must not turn into a device-defined one)."""
    return bool(diffs(view.values, oracle)), not any(_device_defined(run))


def _plus(delays: Delays, extra: Delays, share: float = 1.0) -> Delays:
    return {k: delays.get(k, 0.0) + share * extra.get(k, 0.0) for k in delays.keys() | extra}


def widen(scenario: Scenario, removed: frozenset[str], delays: Delays, oracle: Values,
          min_gap_us: float = MIN_GAP_US, rounds: int = WIDEN_ROUNDS,
          backoff_steps: int = BACKOFF_STEPS) -> Widened:
    """Delay the later access of every tight racing pair that the prediction inverts
    (:func:`inverted`, taken anew each round: a delay pushes later iterations' ops too and can
    invert more pairs, which the prediction then relies on; see the module docstring) while
    the prediction keeps its manifest status; when a round's full widening would change that
    status, keep the largest share of it (bisected) that does not, record the ops, and stop.
    Pairs the prediction leaves in issue order keep their gaps."""
    view, run = sim_run(scenario, removed, delays)
    manifest = _status(view, run, oracle)
    targets = inverted(run)
    tight = tight_pairs(run, min_gap_us, only=targets)
    capped: list[str] = []
    for _ in range(rounds):
        extra: Delays = {}
        for r, need in tight:
            if need > 0:
                acc = r.first if r.manifest else r.second
                key = (acc.op_name, acc.iteration)
                extra[key] = max(extra.get(key, 0.0), need)
        if not extra:
            break
        cand = _plus(delays, extra)
        cview, crun = sim_run(scenario, removed, cand)
        if _status(cview, crun, oracle) == manifest:
            delays, view, run = cand, cview, crun
            targets = inverted(run)
            tight = tight_pairs(run, min_gap_us, only=targets)
            continue
        lo, hi = 0.0, 1.0
        for _ in range(backoff_steps):
            mid = (lo + hi) / 2
            part = _plus(delays, extra, mid)
            pview, prun = sim_run(scenario, removed, part)
            if _status(pview, prun, oracle) == manifest:
                lo, (delays, view, run) = mid, (part, pview, prun)
            else:
                hi = mid
        capped = [f"{n}@{it}" for n, it in sorted(extra)]
        targets = inverted(run)
        tight = tight_pairs(run, min_gap_us, only=targets)
        break
    return Widened(delays, view, run, len(tight), capped, targets)


def _value_explore(scenario: Scenario, removed: frozenset[str], oracle: Values,
                   budget: int) -> tuple[Delays | None, str]:
    """Exploration with the value-level criterion; (shrunk delays or None, source).

    A first search counts a schedule only when its wrong values are the program's alone (no
    read of never-written memory, no duplicate-index scatter): such a prediction holds on a
    GPU whatever its allocator does, so it can be judged exactly. When none is found in
    ``budget`` schedules, any schedule with wrong values will do (the run is then judged
    manifest-only)."""
    def trial(delays: Mapping, jitter: float, seed: int, *, strict: bool) -> ExploreTrial:
        outcome, dev = simulate(scenario, removed, delays=delays, jitter=jitter, seed=seed)
        run = dev.finish()
        got = Values(outcome, dict(dev.observations))
        wrong = bool(diffs(got, oracle))
        if strict:
            wrong = wrong and not any(_device_defined(run))
        return ExploreTrial(run.races, wrong)

    ex = explore(functools.partial(trial, strict=True), budget=budget, seed=scenario.check.seed)
    if ex.shrunk is not None:
        return ex.shrunk, f"{ex.source or 'none'} (program-defined values)"
    ex = explore(functools.partial(trial, strict=False), budget=budget, seed=scenario.check.seed)
    return ex.shrunk, ex.source or "none"


def plan_spec(spec: RunSpec, host_launch_us: float | None = None, floor_us: float = FLOOR_US,
              min_gap_us: float | None = None, explore_budget: int = 32) -> Plan:
    """Simulate one run and, if racy, choose its GPU schedule and predict its values.
    ``min_gap_us`` overrides the widening margin (default: :func:`margin_us` of the run)."""
    sc = with_launch(spec.scenario, spec, host_launch_us)
    launch = sc.timing.host_launch
    try:
        view, _run = sim_run(sc, spec.removed)
        oracle = oracle_run(sc, spec.removed)
        written, _ = sim_run(with_launch(spec.scenario, spec, None), spec.removed)
    except HarnessError as exc:
        return Plan(spec, sc, launch, "error", str(Expect.ERROR), error=str(exc))
    plan = Plan(spec, sc, launch, "racy" if view.races else "race_free", view.verdict,
                oracle=oracle, sim=view, sim_as_written=written.metrics,
                uninit_reads=list(getattr(_run, "uninit_reads", []) or []),
                dup_writes=list(getattr(_run, "dup_writes", []) or []))
    if plan.kind == "race_free":
        return plan
    shrunk, source = _value_explore(sc, spec.removed, oracle, explore_budget)
    plan.explore_delays, plan.schedule_source = shrunk, source
    start = scale_delays(shrunk or {}, floor_us)
    if start:  # the raised delays must still show wrong values, else keep exploration's
        raised, rrun = sim_run(sc, spec.removed, start)
        unscaled, urun = sim_run(sc, spec.removed, shrunk or {})
        if _status(raised, rrun, oracle) != _status(unscaled, urun, oracle):
            start = dict(shrunk or {})
            plan.schedule_source += " (unscaled)"
    plan.margin_us = margin_us(view.metrics) if min_gap_us is None else min_gap_us
    w = widen(sc, spec.removed, start, oracle, plan.margin_us)
    plan.delays, plan.predicted, plan.tight_left, plan.capped = (w.delays, w.view,
                                                                 w.tight_left, w.capped)
    gaps = [gap for _r, gap, _m in pair_gaps(w.run, plan.margin_us, only=w.targets)]
    plan.narrowest_gap_us = round(min(gaps), 1) if gaps else None
    plan.inverted_pairs = len(w.targets)
    plan.predicted_diffs = diffs(plan.predicted.values, oracle)
    plan.predicted_uninit_reads, plan.predicted_dup_writes = _device_defined(w.run)
    plan.predicted_race_kinds = sorted({str(r.kind) for r in w.run.races})
    _outcome, dev = simulate(sc, spec.removed, delays=w.delays, jitter=0.0)
    plan.gates, plan.gates_dropped = gate_pairs(dev.det, dev.finish().timeline)
    return plan
