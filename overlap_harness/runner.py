"""Run scenarios on the simulated device: the overlapped run, its serial oracle, the verdict.

This is the one place that wires ``scenarios`` (what to run), ``model.protocol`` (the program)
and ``sim`` (the device) together; ``reports`` and the CLI read the :class:`CaseResult`s.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from overlap_harness.engines.core.interrupted import Interrupted
from overlap_harness.explore import Trial, explore
from overlap_harness.model.config import Expect, Scenario
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import compute_metrics
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.protocol.oracle import compare_runs
from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import DeviceRun, QuerySite, Race
from overlap_harness.outcomes import Outcomes, explore_outcomes
from overlap_harness.run_pool import in_order, map_in_order
from overlap_harness.scenarios.expand import RunSpec, expand, scenario_to_dict, to_data
from overlap_harness.sim.sim_device import SimDevice

#: ``watch(done, total, ops)`` is told, at each scheduler iteration of a run, how many of the
#: run's iterations (overlapped run, then its oracle) are done and how many device ops so far.
Watch = Callable[[int, int, int], None]

#: The phrase that marks a run refused because its mutation removes a sync never reached.
UNUSED_SYNC = "is never reached"

#: The memory model of :func:`estimate_run_bytes`, fitted to the peak resident size
#: (``ru_maxrss``) of single runs on the CPU simulation, spec_v2, 2 to 14 requests, iterations
#: 20 to 1,000, max_context 128 to 32,768, pool_size 16 and 32, prompts of 8 and 4,000
#: tokens (a dozen runs): estimates within 10% or 10 MiB of the measurement (1,000 iterations
#: at max_context 2,048: 239 MiB estimated, 261 measured), but for one over-estimate, a run
#: whose requests finished early (79 MiB estimated, 47 measured). The request pool's
#: per-element state (the detector's last accesses and the values of req_to_token, pool_size
#: x max_context) dominates; each iteration adds state per context column (snapshots) and
#: per op (timeline, happens-before nodes).
BYTES_PER_POOL_ELEMENT = 1100
BYTES_PER_ITERATION_COLUMN = 70
BYTES_PER_ITERATION = 40_000
BYTES_FIXED = 30 * 2**20

#: The collector's young-generation threshold while a suite runs (CPython 3.11's default is
#: 700, 3.13's 2,000). A run allocates some 100,000 objects, most of them freed by reference
#: counting; at the default the collector ran about 800 times in the bundled suite's runs,
#: 0.4 of its 7 CPU s in one process (``gc.callbacks``), and about 0.15 s at 20,000. The
#: cycles a run leaves are still freed within a run or two.
GC_THRESHOLD_0 = 20_000

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


class _WatchedSimDevice(SimDevice):
    """A SimDevice that tells a :data:`Watch` about each scheduler iteration (progress)."""

    def __init__(self, *args: Any, watch: Callable[[int, int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch

    def set_iteration(self, n: int) -> None:
        """Tag what follows with iteration ``n`` and report it with the op count so far."""
        super().set_iteration(n)
        self._watch(n, self._next_op())


def simulate(
    scenario: Scenario,
    removed: Iterable[str] = (),
    *,
    serial: bool = False,
    delays: Mapping[tuple[str, int], float] | None = None,
    jitter: float | None = None,
    seed: int | None = None,
    watch: Callable[[int, int], None] | None = None,
    values: str = "timed",
    query_outcomes: Outcomes | None = None,
    shadow: bool = True,
) -> tuple[Any, SimDevice]:
    """Run the protocol of ``scenario`` once on a fresh SimDevice; returns (outcome, device).

    ``watch(iteration, ops)``, when given, is called as each scheduler iteration starts;
    ``values`` is the device's value mode (``"issue_order"`` for the verdict's run);
    ``query_outcomes`` forces the answers of branching ``query()`` calls (default False);
    ``shadow=False`` (with ``serial`` only) skips the detector's element checks."""
    torch.set_num_threads(1)  # the value model's tensors are tiny: threads only cost here
    t = scenario.timing
    device_class: Any = SimDevice
    extra: dict[str, Any] = {}
    if watch is not None:
        device_class, extra = _WatchedSimDevice, {"watch": watch}
    dev = device_class(
        removed,
        host_launch_us=t.host_launch,
        jitter=t.jitter if jitter is None else jitter,
        seed=scenario.check.seed if seed is None else seed,
        serial=serial,
        delays=delays,
        values=values,
        query_outcomes=query_outcomes,
        shadow=shadow,
        **extra,
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
    under any timing (STREAM-SEMANTICS.md, "Program edges and observations"). A timed run in
    which no racing pair ran against issue order (no race manifest) read every value issue
    order gives (happens-before pairs always run in issue order), so its trace is already the
    program's and is not run again."""
    if all(race.manifest is False for race in timed.races):
        return timed.races
    _outcome, dev = simulate(scenario, removed, delays=delays, jitter=jitter, seed=seed,
                             values="issue_order")
    return dev.finish().races


def estimate_run_bytes(scenario: Scenario) -> int:
    """Estimated peak memory of the largest run of ``scenario`` (base or a mutation whose
    ``set`` changes its size) beyond the interpreter's own; see :data:`BYTES_FIXED`."""
    iterations = scenario.workload.iterations
    worst = 0
    for spec in expand(scenario):
        columns = spec.protocol.max_context
        worst = max(worst, BYTES_FIXED + BYTES_PER_ITERATION * iterations
                    + BYTES_PER_POOL_ELEMENT * spec.protocol.pool_size * columns
                    + BYTES_PER_ITERATION_COLUMN * iterations * columns)
    return worst


def available_memory_bytes() -> int | None:
    """Memory a run may take now: ``MemAvailable`` of /proc/meminfo (Linux), else the
    physical memory; None when neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def unused_removals(spec: RunSpec, labels_used: Iterable[str]) -> list[str]:
    """Problem lines for the syncs ``spec`` removes that the run never reached.

    Removing a sync the configuration never performs changes nothing, so the run would pass
    for no reason (a silent pass); it is an error unless the mutation says
    ``allow_unused = true``. Each line names the file and the key: ``x.toml:
    mutation[1].remove[0]: ...``."""
    if spec.allow_unused or spec.mutation_index < 0:
        return []
    reached = set(labels_used)
    mutation = spec.scenario.mutation[spec.mutation_index]
    key = f"mutation[{spec.mutation_index}]"
    return [f"{spec.scenario.path}: {key}.remove[{j}]: sync label \"{label}\" {UNUSED_SYNC} "
            "in this configuration, so removing it changes nothing; remove it from the list "
            f"or set allow_unused = true in {key}"
            for j, label in enumerate(mutation.remove) if label not in reached]


def failure_report(result: CaseResult, max_races: int = 5) -> str:
    """Why a run failed, for people: expected and computed verdicts, the expected races not
    found, and the race reports (each naming both accesses) of up to ``max_races`` races."""
    lines = [f"FAIL {result.name}: expected {result.expect}, computed {result.verdict}"
             + (f" ({result.error})" if result.error else "")]
    if result.missing:
        lines.append("  expected races not found: " + ", ".join(result.missing))
    for race in result.races[:max_races]:
        lines.append("  " + race.describe().replace("\n", "\n  "))
    if len(result.races) > max_races:
        lines.append(f"  ... and {len(result.races) - max_races} more race(s)")
    return "\n".join(lines)


def run_spec(spec: RunSpec, *, delays: Mapping[tuple[str, int], float] | None = None,
             jitter: float | None = None, seed: int | None = None,
             watch: Watch | None = None, oracle: bool = True) -> CaseResult:
    """Run one expanded scenario (base or mutation) and its oracle; compute the verdict.

    A mutation that removes a sync the run never reached gets the verdict ``error`` and
    fails whatever it expects (see :func:`unused_removals`). ``oracle=False``: see
    :func:`execute`."""
    return judge(spec, execute(spec, delays=delays, jitter=jitter, seed=seed, watch=watch,
                               oracle=oracle))


def execute(spec: RunSpec, *, delays: Mapping[tuple[str, int], float] | None = None,
            jitter: float | None = None, seed: int | None = None,
            watch: Watch | None = None, timeline: bool = True,
            oracle: bool = True) -> CaseResult:
    """The runs of ``spec`` (overlapped, verdict, serial oracle) and what they computed, not
    yet held against what ``spec`` expects: :func:`judge` does that (``ok``, ``missing``, a
    removal never reached, the configuration). The verdict is ``error`` only when the harness
    refused the run (``error`` says why). Everything here is a function of
    :func:`run_key` (and the schedule arguments), so one result serves every spec of that key.

    ``timeline=False`` leaves the result's timeline empty (its metrics are computed from it
    first): most of a result's bytes, for callers that neither plot nor save it.
    ``oracle=False`` skips the serial oracle, whose values only the value differences read
    (left empty): the verdict, races, faults and labels reached are the same, for callers
    that read no more (the SGLang loop report's model column)."""
    sc = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    iterations = sc.workload.iterations

    def phase(offset: int) -> Callable[[int, int], None] | None:
        if watch is None:
            return None
        return lambda n, ops: watch(min(offset + n, 2 * iterations), 2 * iterations, ops)
    base = CaseResult(
        run_id=spec.run_id, scenario=sc.name, mutation=spec.mutation_name, path=sc.path,
        expect=str(spec.expect), verdict=ERROR, ok=False, removed=tuple(sorted(spec.removed)),
    )
    started = time.perf_counter()
    try:
        outcome, dev = simulate(sc, spec.removed, delays=delays, jitter=jitter, seed=seed,
                                watch=phase(0))
        run = dev.finish()
        run.races = canonical_races(sc, spec.removed, run, delays=delays, jitter=jitter,
                                    seed=seed)
        # read for its values only: no element checks (no two of its ops are unordered) and
        # no records built (SimDevice's shadow and drain)
        serial = odev = None
        if oracle:
            serial, odev = simulate(sc, spec.removed, serial=True, watch=phase(iterations),
                                    shadow=False)
            odev.drain()
    except HarnessError as exc:
        base.error = str(exc)
        base.wall_s = time.perf_counter() - started
        return base
    base.wall_s = time.perf_counter() - started  # the run, its verdict run and its oracle
    base.races = run.races
    base.query_sites = run.query_sites
    base.timeline = run.timeline if timeline else []
    base.skipped_syncs = run.skipped_syncs
    base.labels_used = sorted(dev.labels_used)
    base.uninit_reads = run.uninit_reads
    base.dup_writes = run.dup_writes
    base.metrics = compute_metrics(run.timeline)
    base.value_diffs = [] if odev is None else [
        _as_dict(d) for d in compare_runs(outcome, dev.observations, serial, odev.observations)]
    base.faults = [f"{f.check} at iteration {f.iteration} ({f.request}): {f.detail}"
                   for f in outcome.debug_failures]
    base.verdict = RACE if run.races else FAULT if base.faults else RACE_FREE
    return base


def judge(spec: RunSpec, done: CaseResult) -> CaseResult:
    """``done`` (:func:`execute` of ``spec`` or of a spec of the same :func:`run_key`) held
    against what ``spec`` expects: a copy named as ``spec``, with its configuration, ``ok``
    and the expected races not found; a removal the run never reached makes it an error."""
    sc = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    result = dataclasses.replace(
        done, run_id=spec.run_id, scenario=sc.name, mutation=spec.mutation_name,
        path=sc.path, expect=str(spec.expect), config=scenario_to_dict(sc))
    if result.verdict == ERROR:  # refused by the harness: nothing else was computed
        result.ok = str(spec.expect) == ERROR
        return result
    found = set(result.race_keys())
    result.missing = [k for k in spec.races if k not in found]
    result.ok = result.verdict == str(spec.expect) and not result.missing
    unused = unused_removals(spec, result.labels_used)
    if unused:
        result.verdict, result.ok, result.error = ERROR, False, "\n".join(unused)
    return result


def run_key(spec: RunSpec) -> str:
    """What decides the runs of ``spec``: its protocol (mutation applied), workload, timing,
    seed and removed syncs, as canonical JSON. Two specs of one key run alike (the names,
    the file and the expectations only enter in :func:`judge`); unlike the run id's hash,
    this leaves nothing out (the ``late`` keys at their defaults, a profile's costs)."""
    sc = spec.scenario
    return json.dumps([to_data(spec.protocol), to_data(sc.workload), to_data(sc.timing),
                       sc.check.seed, sorted(spec.removed)], sort_keys=True, default=str)


def run_scenarios(
    scenarios: Iterable[Scenario],
    progress: Callable[[int, int, str], None] | None = None,
    watch: Watch | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
    jobs: int = 1,
    timelines: bool = True,
) -> list[CaseResult]:
    """Expand every scenario into its runs and run them all, reporting progress (per run,
    and through ``watch`` per iteration inside each run). ``on_result`` is handed each
    result as its run ends (the plot workers start drawing while later runs simulate).
    ``timelines=False``: the results come without their timelines (:func:`execute`), which
    spares a pool's workers and this process sending and receiving them.

    Specs of one :func:`run_key` (the bundled suite has 115 runs of 103 keys: scenarios
    written for different syncs share a base configuration) are run once; each gets its
    own copy, named and judged as it (:func:`judge`), as if it had been run (``wall_s`` is
    that of the one run).

    ``jobs > 1``: the runs are shared among that many processes forked from this one (each
    run is a function of its spec alone, so the results, in spec order, are those of one
    process); ``watch`` then sees nothing, since it cannot cross into them."""
    specs = [s for sc in scenarios for s in expand(sc)]
    first = first_of_key(specs)
    unique = [spec for i, spec in enumerate(specs) if first[i] == i]
    gc.freeze()  # what the imports made lives as long as the process: out of every collection
    thresholds = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD_0, *thresholds[1:])  # here and in the forked workers
    try:
        work = functools.partial(execute, timeline=timelines)
        return _run_specs(specs, first, unique, work, progress, watch, on_result, jobs)
    finally:
        gc.set_threshold(*thresholds)


def _run_specs(specs: list[RunSpec], first: list[int], unique: list[RunSpec],
               work: Callable[..., CaseResult],
               progress: Callable[[int, int, str], None] | None, watch: Watch | None,
               on_result: Callable[[CaseResult], None] | None, jobs: int) -> list[CaseResult]:
    """:func:`run_scenarios` once its specs are expanded: ``work`` (:func:`execute`) over
    ``unique`` (in ``jobs`` processes), every spec judged, in spec order."""
    if jobs > 1 and len(unique) > 1 and "fork" in multiprocessing.get_all_start_methods():
        done = in_order(work, unique, min(jobs, len(unique)), start="fork")
    else:
        done = in_order(functools.partial(work, watch=watch) if watch is not None
                         else work, unique)
    executed: dict[int, CaseResult] = {}  # by the index of the first spec of its key
    out: list[CaseResult] = []
    try:
        for i, spec in enumerate(specs):
            if progress is not None:
                progress(i, len(specs), spec.run_id)
            if first[i] == i:
                executed[i] = next(done)
            out.append(judge(spec, executed[first[i]]))
            if on_result is not None:
                on_result(out[-1])
        next(done, None)  # the end: the pool is closed and joined
    except KeyboardInterrupt:  # Ctrl-C: the runs that finished go up with it
        raise Interrupted(out) from None
    finally:
        done.close()  # stops the pool at once if runs are left (an error, Ctrl-C)
    if progress is not None:
        progress(len(specs), len(specs), "")
    return out


def first_of_key(specs: list[RunSpec]) -> list[int]:
    """For each spec, the index of the first spec of its :func:`run_key` (itself if none
    comes before it)."""
    seen: dict[str, int] = {}
    return [seen.setdefault(run_key(spec), i) for i, spec in enumerate(specs)]


def _trial(spec: RunSpec):
    """One exploration trial: :func:`run_spec` under a schedule, reduced to what
    :func:`~overlap_harness.explore.explore` needs (races, and whether any manifested)."""
    def trial(delays, jitter, seed) -> Trial:
        r = run_spec(spec, delays=delays, jitter=jitter, seed=seed)
        if r.error is not None:
            raise HarnessError(r.error)
        return Trial(r.races, r.manifest)

    return trial


def explore_spec(spec: RunSpec, budget: int = 64, time_limit_s: float | None = None,
                 watch: Callable[[int, int], None] | None = None) -> list[str] | None:
    """Explore one run; a table row, or None when the detector finds it race-free.

    ``watch(tried, budget)`` is told after each schedule tried. A top-level function so a
    process pool can run it (``explore_specs(jobs=N)``)."""
    sc = spec.scenario
    trial = _trial(spec)
    first = run_spec(spec, delays={}, jitter=0.0, seed=sc.check.seed)  # explore's baseline
    if first.error is not None:
        return None
    base = Trial(first.races, first.manifest)
    branch_only = outcome_races(spec) if first.query_sites else []
    if not base.races and not branch_only:
        return None
    ex = explore(trial, budget=budget, time_limit_s=time_limit_s, seed=sc.check.seed,
                 progress=watch, baseline=base)
    keys = ", ".join(sorted({r.key for r in base.races}
                            | {f"{r.key} (only when {' and '.join(r.needs)})"
                               for r in branch_only}))
    keys = keys if len(keys) <= 70 else keys[:67] + "..."
    shrunk = "-" if ex.shrunk is None else ", ".join(
        f"{n}@{it}+{us:.0f}us" for (n, it), us in sorted(ex.shrunk.items())) or "(none)"
    return [spec.run_id, keys, "yes" if ex.manifest else "NO", ex.source or "-",
            str(ex.tried), shrunk]


def outcome_races(spec: RunSpec, max_runs: int = 64) -> list[Race]:
    """The races of ``spec`` that only some answers of its branching ``query()`` calls have,
    each naming the answers it needs (:mod:`overlap_harness.outcomes`); issue-order values,
    as for the verdict."""
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)

    def program(outcomes: Outcomes) -> tuple[list[Race], list[QuerySite]]:
        _outcome, dev = simulate(scenario, spec.removed, values="issue_order",
                                 query_outcomes=outcomes)
        run = dev.finish()
        return run.races, run.query_sites

    return [r for r in explore_outcomes(program, max_runs).races if r.needs]


def explore_specs(
    scenarios: Iterable[Scenario],
    budget: int = 64,
    time_limit_s: float | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    jobs: int = 1,
    watch: Callable[[int, int], None] | None = None,
) -> tuple[list[list[str]], int]:
    """Explore every run the detector finds racy (in ``jobs`` processes); rows for a table
    and the count of racy runs not made manifest. ``watch(tried, budget)`` follows the
    schedules tried inside a run (in one process only: it cannot cross into a pool)."""
    specs = [s for sc in scenarios for s in expand(sc)]
    work = functools.partial(explore_spec, budget=budget, time_limit_s=time_limit_s,
                             watch=watch if jobs <= 1 else None)
    found = map_in_order(work, specs, progress, jobs)
    rows = [r for r in found if r is not None]
    return rows, sum(r[2] != "yes" for r in rows)
