"""Differential replay: run each planned run on a device N times and hold it to the simulator.

STREAM-SEMANTICS.md ("Determinism"): a race-free program computes the same values under every
timing, so its values on a GPU must be bit-identical to the simulator's and to the serial
oracle's; a racy one must compute the simulator's values under the same forced interleaving.
This module runs the trials and counts, per run of the suite (:class:`RunReplay`):

- race-free runs: trials whose every value equals the simulated run's, and the oracle's;
- racy runs: trials under the plan's delays whose every value equals the simulator's
  prediction (and whose wrong values, diff by diff, are the predicted ones, and the trials
  whose wrong values are at the predicted places, whatever their values: the criterion of a
  manifest-only run, :attr:`Plan.match_class`), plus trials with no delay at all, the
  baseline rate at which the race shows by itself;
- for every run, the detector's verdict on the device's own trace, and the device's metrics
  (median over trials) beside the simulated ones.

The device is a parameter (:data:`DeviceFactory`), so the loop runs on CPU with ``SimDevice``
standing in for ``CudaDevice``. Nothing here imports ``sim`` or ``gpu_check``.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.model.device import Device
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import Metrics, compute_metrics, rel_err  # noqa: F401  (re-exported)
from overlap_harness.model.opkeys import Gate
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.trace import OpKind, OpRecord
from overlap_harness.replay.plan import (
    DETERMINISTIC,
    EXACT,
    Plan,
    Values,
    diff_keys,
    diffs,
    verdict_of,
)

DeviceFactory = Callable[[Plan, Mapping[tuple[str, int], float], Sequence[Gate]], Device]
TIMED = ("iteration_ns", "host_stall_ns", "forward_idle_ns")
_ISSUED = (OpKind.KERNEL, OpKind.COPY, OpKind.RECORD, OpKind.WAIT)


@dataclass(slots=True)
class TrialResult:
    """One run on the device: what it read, the detector's verdict, its metrics."""

    values: Values | None
    verdict: str
    metrics: Metrics | None = None
    error: str | None = None
    gates_unset: int = 0  # gates no op set (the run left the plan's path)
    gate_timeout: bool = False  # the watchdog released the gates


def run_trial(plan: Plan, factory: DeviceFactory, delays: Mapping[tuple[str, int], float],
              gates: Sequence[Gate] = ()) -> TrialResult:
    """Run the plan's protocol once on a fresh device; an exception becomes an error verdict
    (with its message) instead of stopping the suite."""
    dev = factory(plan, delays, gates)
    try:
        outcome = run_protocol(dev, plan.scenario)
        run = dev.finish()  # type: ignore[attr-defined]  # both devices have it
    except HarnessError as exc:
        return TrialResult(None, "error", error=str(exc))
    except Exception as exc:  # a device failure is a result to report, not a crash
        return TrialResult(None, "error", error=f"{type(exc).__name__}: {exc}")
    values = Values(outcome, dict(dev.observations))
    stats = getattr(dev, "gate_stats", None)
    return TrialResult(values, verdict_of(run.races, outcome), compute_metrics(run.timeline),
                       gates_unset=stats.unset if stats else 0,
                       gate_timeout=bool(stats and stats.timed_out))


@dataclass(slots=True)
class Tally:
    """Counts over the trials of one schedule, against a reference run and the oracle.

    ``equal``: every value equal to the reference's; ``same_diffs``: the differences from the
    oracle are the reference's, line for line; ``same_keys``: they are at the reference's
    places (:func:`diff_keys`: what, iteration, request), whatever the values there;
    ``manifest``: some value differs from the oracle's. ``equal <= same_diffs <= same_keys``.
    """

    delays: dict[tuple[str, int], float] = field(default_factory=dict)
    gates: int = 0
    gates_unset: int = 0
    gate_timeouts: int = 0
    trials: int = 0
    equal: int = 0
    same_diffs: int = 0
    same_keys: int = 0
    equal_oracle: int = 0
    manifest: int = 0
    verdicts: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    first_mismatch: list[str] = field(default_factory=list)
    metrics: list[Metrics] = field(default_factory=list)

    def add(self, t: TrialResult, reference: Values | None, oracle: Values | None) -> None:
        """Count one trial."""
        self.trials += 1
        self.verdicts[t.verdict] += 1
        self.gates_unset += t.gates_unset
        self.gate_timeouts += t.gate_timeout
        if t.metrics is not None:
            self.metrics.append(t.metrics)
        if t.values is None:
            if t.error and t.error not in self.errors and len(self.errors) < 3:
                self.errors.append(t.error)
            return
        if reference is not None:
            vs_ref = diffs(t.values, reference)
            self.equal += not vs_ref
            if vs_ref and not self.first_mismatch:
                self.first_mismatch = [d.replace(", oracle had ", ", simulator had ")
                                       for d in vs_ref[:3]]
        if oracle is not None:
            vs_oracle = diffs(t.values, oracle)
            self.equal_oracle += not vs_oracle
            self.manifest += bool(vs_oracle)
            if reference is not None:
                self.same_diffs += vs_oracle == diffs(reference, oracle)
                self.same_keys += diff_keys(t.values, oracle) == diff_keys(reference, oracle)

    def median_metrics(self) -> dict[str, float] | None:
        """Per metric, the median over the trials that completed."""
        if not self.metrics:
            return None
        return {k: statistics.median(getattr(m, k) for m in self.metrics) for k in TIMED}


@dataclass(slots=True)
class RunReplay:
    """One run of the suite replayed: the plan, the main tally (race-free: no delay; racy: the
    plan's delays), the racy runs' no-delay baseline, and CSAN's verdict when asked for."""

    plan: Plan
    main: Tally
    baseline: Tally | None = None
    csan: dict[str, Any] | None = None

    @property
    def agreement(self) -> bool:
        """Race-free runs: every trial bit-identical to the simulator and to the oracle."""
        m = self.main
        return m.trials > 0 and m.equal == m.equal_oracle == m.trials

    @property
    def compared(self) -> bool:
        """A race-free run whose values are the program's alone (no never-written memory
        read, no duplicate-index scatter): the runs bit-identical agreement is required of."""
        return self.plan.kind == "race_free" and self.plan.values_class == DETERMINISTIC

    @property
    def hits(self) -> int:
        """Racy runs: the main trials that count under the plan's ``match_class``: the
        prediction's exact values (``exact``), or wrong values at the prediction's places
        (manifest-only)."""
        return self.main.equal if self.plan.match_class == EXACT else self.main.same_keys

    def match_rate(self) -> float:
        """Share of main trials whose values are the simulator's prediction (0 without any)."""
        return self.main.equal / self.main.trials if self.main.trials else 0.0

    def sim_metrics(self) -> Metrics | None:
        """The simulated run the device's metrics are held against."""
        p = self.plan
        view = p.predicted if p.kind == "racy" else p.sim
        return None if view is None else view.metrics


def trials_of(plan: Plan, factory: DeviceFactory, delays: Mapping[tuple[str, int], float],
              n: int, reference: Values | None, gates: Sequence[Gate] = ()) -> Tally:
    """``n`` trials of one schedule, counted against ``reference`` and the plan's oracle."""
    tally = Tally(delays=dict(delays), gates=len(gates))
    for _ in range(n):
        tally.add(run_trial(plan, factory, delays, gates), reference, plan.oracle)
    return tally


def replay(plan: Plan, factory: DeviceFactory, trials: int = 20,
           baseline_trials: int | None = None, warm_up: bool = True,
           gated: bool = True) -> RunReplay:
    """Replay one plan (see the module docstring). An error run gets one trial: it only has
    to be refused on the device too. ``warm_up`` runs one unmeasured trial first (CUDA loads
    a kernel's module at its first launch, which can stall the GPU). A racy run's main
    trials keep the plan's gates unless ``gated`` is False (delays alone)."""
    if plan.kind == "error":
        return RunReplay(plan, trials_of(plan, factory, {}, 1, None))
    if warm_up:
        run_trial(plan, factory, {})
    if plan.kind == "race_free":
        assert plan.sim is not None
        return RunReplay(plan, trials_of(plan, factory, {}, trials, plan.sim.values))
    assert plan.predicted is not None and plan.sim is not None
    main = trials_of(plan, factory, plan.delays, trials, plan.predicted.values,
                     plan.gates if gated else ())
    nb = trials if baseline_trials is None else baseline_trials
    base = trials_of(plan, factory, {}, nb, plan.sim.values)
    return RunReplay(plan, main, base)


def replay_all(plans: Iterable[Plan], factory: DeviceFactory, trials: int = 20,
               baseline_trials: int | None = None,
               progress: Callable[[int, str], None] | None = None,
               gated: bool = True) -> list[RunReplay]:
    """Replay every plan in order (plans may arrive from a pool while earlier ones replay)."""
    out = []
    for i, plan in enumerate(plans):
        if progress is not None:
            progress(i, plan.spec.run_id)
        out.append(replay(plan, factory, trials, baseline_trials, gated=gated))
    return out


def launch_cost_us(timeline: Sequence[OpRecord]) -> float:
    """The host's median cost of issuing one stream op: the gap between the issue times of two
    consecutive stream ops (kernel, copy, record, wait) with nothing else in between."""
    ops = sorted(timeline, key=lambda t: t.op)
    gaps = [b.issue_ns - a.issue_ns for a, b in itertools.pairwise(ops)
            if a.kind in _ISSUED and b.kind in _ISSUED]
    if not gaps:
        raise HarnessError("no two consecutive stream ops in the timeline to time a launch")
    return statistics.median(gaps) / 1000


