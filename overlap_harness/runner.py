"""Run scenarios on the simulated device: the overlapped run, its serial oracle, the verdict.

This is the one place that wires ``scenarios`` (what to run), ``model.protocol`` (the program)
and ``sim`` (the device) together; ``reports`` and the CLI read the :class:`CaseResult`s.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from model.config import Expect, Scenario
from model.errors import HarnessError
from model.metrics import compute_metrics
from model.protocol import run_protocol
from model.protocol.oracle import compare_runs
from model.results import CaseResult
from model.trace import DeviceRun, Race
from scenarios.expand import RunSpec, expand, scenario_to_dict
from sim.device import SimDevice

RACE = str(Expect.RACE)
RACE_FREE = str(Expect.RACE_FREE)
FAULT = str(Expect.FAULT)
ERROR = str(Expect.ERROR)


def _as_dict(diff: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(diff):
        return {k: _plain(v) for k, v in dataclasses.asdict(diff).items()}
    return dict(diff)


def _plain(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return v.tolist()
    return v


def simulate(
    scenario: Scenario,
    removed: Iterable[str] = (),
    *,
    serial: bool = False,
    delays: Mapping[tuple[str, int], float] | None = None,
    jitter: float | None = None,
    seed: int | None = None,
    values: str = "timed",
) -> tuple[Any, SimDevice]:
    """Run the protocol of ``scenario`` once on a fresh SimDevice; returns (outcome, device).

    ``values`` is the device's value mode (``"issue_order"`` for the verdict's run)."""
    t = scenario.timing
    dev = SimDevice(
        removed,
        host_launch_us=t.host_launch,
        jitter=t.jitter if jitter is None else jitter,
        seed=scenario.check.seed if seed is None else seed,
        serial=serial,
        delays=delays,
        values=values,
    )
    outcome = run_protocol(dev, scenario)
    return outcome, dev


def canonical_races(scenario: Scenario, removed: Iterable[str], timed: DeviceRun, *,
                    delays: Mapping[tuple[str, int], float] | None = None,
                    jitter: float | None = None, seed: int | None = None) -> list[Race]:
    """The verdict's races: those of the run whose values follow issue order.

    A race that manifests can corrupt a value the host branches on (a finished request, an
    accepted length) and so change the accesses that follow; the race set of a timed run can
    then depend on timing. The run with issue-order values has the program's own control flow
    under any timing (STREAM-SEMANTICS.md, "Program edges and observations"). A timed run
    without races had no race to corrupt a value, so its trace is already the program's."""
    if not timed.races:
        return timed.races
    _outcome, dev = simulate(scenario, removed, delays=delays, jitter=jitter, seed=seed,
                             values="issue_order")
    return dev.finish().races


def run_spec(spec: RunSpec, *, delays: Mapping[tuple[str, int], float] | None = None,
             jitter: float | None = None, seed: int | None = None) -> CaseResult:
    """Run one expanded scenario (base or mutation) and its oracle; compute the verdict."""
    sc = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    base = CaseResult(
        run_id=spec.run_id, scenario=sc.name, mutation=spec.mutation_name, path=sc.path,
        expect=str(spec.expect), verdict="error", ok=False, removed=tuple(sorted(spec.removed)),
        config=scenario_to_dict(sc),
    )
    try:
        outcome, dev = simulate(sc, spec.removed, delays=delays, jitter=jitter, seed=seed)
        run = dev.finish()
        run.races = canonical_races(sc, spec.removed, run, delays=delays, jitter=jitter,
                                    seed=seed)
        oracle, odev = simulate(sc, spec.removed, serial=True)
        odev.finish()
    except HarnessError as exc:
        base.error = str(exc)
        base.ok = str(spec.expect) == ERROR
        return base
    base.races = run.races
    base.timeline = run.timeline
    base.skipped_syncs = run.skipped_syncs
    base.labels_used = sorted(dev.labels_used)
    base.uninit_reads = run.uninit_reads
    base.dup_writes = run.dup_writes
    base.metrics = compute_metrics(run.timeline)
    base.value_diffs = [_as_dict(d) for d in compare_runs(outcome, dev.observations,
                                                            oracle, odev.observations)]
    base.faults = [f"{f.check} at iteration {f.iteration} ({f.request}): {f.detail}"
                   for f in outcome.debug_failures]
    base.verdict = RACE if run.races else FAULT if base.faults else RACE_FREE
    found = set(base.race_keys())
    base.missing = [k for k in spec.races if k not in found]
    base.ok = base.verdict == str(spec.expect) and not base.missing
    return base


def run_scenarios(
    scenarios: Iterable[Scenario],
    progress: Callable[[int, int, str], None] | None = None,
) -> list[CaseResult]:
    """Expand every scenario into its runs and run them all, reporting progress."""
    return _map_specs(run_spec, [s for sc in scenarios for s in expand(sc)], progress)


def _map_specs(fn: Callable[[RunSpec], Any], specs: list[RunSpec],
               progress: Callable[[int, int, str], None] | None, jobs: int = 1) -> list[Any]:
    """``fn`` over ``specs`` in order (in a ``jobs``-process pool when > 1), with progress."""
    out: list[Any] = []
    pool = multiprocessing.get_context("spawn").Pool(jobs) if jobs > 1 else None
    try:
        results = pool.imap(fn, specs) if pool is not None else map(fn, specs)
        for i, spec in enumerate(specs):
            if progress is not None:
                progress(i, len(specs), spec.run_id)
            out.append(next(results))
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    if progress is not None:
        progress(len(specs), len(specs), "")
    return out


def _trial(spec: RunSpec):
    """One exploration trial: :func:`run_spec` under a schedule, reduced to what
    :func:`~overlap_harness.explore.explore` needs (races, and whether any manifested)."""
    from overlap_harness.explore import Trial

    def trial(delays, jitter, seed) -> Trial:
        r = run_spec(spec, delays=delays, jitter=jitter, seed=seed)
        if r.error is not None:
            raise HarnessError(r.error)
        return Trial(r.races, r.manifest)

    return trial


def explore_spec(spec: RunSpec, budget: int = 64,
                 time_limit_s: float | None = None) -> list[str] | None:
    """Explore one run; a table row, or None when the detector finds it race-free.

    A top-level function so a process pool can run it (``explore_specs(jobs=N)``)."""
    from overlap_harness.explore import explore

    sc = spec.scenario
    trial = _trial(spec)
    try:
        base = trial({}, 0.0, sc.check.seed)
    except HarnessError:
        return None
    if not base.races:
        return None
    ex = explore(trial, budget=budget, time_limit_s=time_limit_s, seed=sc.check.seed)
    keys = ", ".join(sorted({r.key for r in base.races}))
    keys = keys if len(keys) <= 70 else keys[:67] + "..."
    shrunk = "-" if ex.shrunk is None else ", ".join(
        f"{n}@{it}+{us:.0f}us" for (n, it), us in sorted(ex.shrunk.items())) or "(none)"
    return [spec.run_id, keys, "yes" if ex.manifest else "NO", ex.source or "-",
            str(ex.tried), shrunk]


def explore_specs(
    scenarios: Iterable[Scenario],
    budget: int = 64,
    time_limit_s: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    jobs: int = 1,
) -> tuple[list[list[str]], int]:
    """Explore every run the detector finds racy (in ``jobs`` processes); rows for a table
    and the count of racy runs not made manifest."""
    specs = [s for sc in scenarios for s in expand(sc)]
    work = functools.partial(explore_spec, budget=budget, time_limit_s=time_limit_s)
    found = _map_specs(work, specs, progress, jobs)
    rows = [r for r in found if r is not None]
    return rows, sum(r[2] != "yes" for r in rows)
