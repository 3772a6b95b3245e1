"""Exploration: find a schedule under which a race manifests, then shrink it.

A schedule is a set of injected delays, ``{(op name, iteration): microseconds}`` added before
an op starts (plus an optional seeded jitter of every duration). The detector's verdict does
not depend on the schedule (happens-before is fixed by the program); whether a race
*manifests* (the reader sees another value, the final value differs) does.

Three sources of candidate schedules, tried in order within a budget:

1. **targeted**: for each racing pair, the one delay that inverts it: hold back the
   earlier-issued access's op by the gap between the two accesses plus a margin;
2. **exhaustive**: when the run has at most ``max_exhaustive`` racing pairs, every subset of
   pairs inverted together (the distinct orders of the racing accesses the device allows);
3. **random**: seeded jitter plus random delays on racing ops.

The first manifest schedule is shrunk by removing delays one at a time while it still
manifests (a 1-minimal set: no single delay can be dropped).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from overlap_harness.model.trace import Race

Delays = dict[tuple[str, int], float]
MARGIN_US = 5.0


@dataclass(frozen=True, slots=True)
class Trial:
    """What one schedule produced."""

    races: list[Race]
    manifest: bool


TrialFn = Callable[[Mapping[tuple[str, int], float], float, int], Trial]


@dataclass(slots=True)
class Exploration:
    """The outcome of exploring one run."""

    tried: int = 0
    found: Delays | None = None
    jitter: float = 0.0
    seed: int = 0
    shrunk: Delays | None = None
    source: str = ""
    seconds: float = 0.0
    manifest_at_baseline: bool = False
    log: list[str] = field(default_factory=list)

    @property
    def manifest(self) -> bool:
        """A manifest schedule was found (or the baseline already manifested)."""
        return self.manifest_at_baseline or self.found is not None


def inverting_delay(race: Race) -> Delays:
    """The delay that makes ``race``'s second access take effect before its first."""
    a, b = race.first, race.second
    if a.time_ns is None or b.time_ns is None or a.agent == "host":
        return {}
    gap_us = max(0.0, (b.time_ns - a.time_ns) / 1000.0)
    return {(a.op_name, a.iteration): gap_us + MARGIN_US}


def _merge(ds: list[Delays]) -> Delays:
    out: Delays = {}
    for d in ds:
        for k, v in d.items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def shrink(delays: Delays, still_manifest: Callable[[Delays], bool]) -> Delays:
    """Drop delays one at a time while the schedule still manifests (1-minimal result)."""
    cur = dict(delays)
    changed = True
    while changed and len(cur) > 1:
        changed = False
        for k in list(cur):
            trial = {kk: v for kk, v in cur.items() if kk != k}
            if still_manifest(trial):
                cur = trial
                changed = True
    return cur


def explore(
    trial: TrialFn,
    budget: int = 64,
    time_limit_s: float | None = None,
    seed: int = 0,
    max_exhaustive: int = 6,
    progress: Callable[[int, int], None] | None = None,
    baseline: Trial | None = None,
) -> Exploration:
    """Search for a manifest schedule of the run that ``trial`` executes; see module doc.

    ``progress(tried, budget)`` is told after the baseline and before each further trial;
    ``baseline`` is the unscheduled trial when the caller has run it already (not run again)."""
    t0 = time.perf_counter()
    ex = Exploration(seed=seed)
    base = trial({}, 0.0, seed) if baseline is None else baseline
    ex.tried = 1
    if progress is not None:
        progress(ex.tried, budget)
    if base.manifest:
        ex.manifest_at_baseline = True
        ex.found, ex.shrunk, ex.source = {}, {}, "baseline"
        ex.seconds = time.perf_counter() - t0
        return ex
    singles = [d for d in (inverting_delay(r) for r in base.races) if d]
    unique = list({tuple(sorted(d.items())): d for d in singles}.values())
    candidates: list[tuple[str, Delays, float, int]] = [("targeted", d, 0.0, seed) for d in unique]
    if 1 < len(unique) <= max_exhaustive:
        for k in range(2, len(unique) + 1):
            for combo in itertools.combinations(unique, k):
                candidates.append(("exhaustive", _merge(list(combo)), 0.0, seed))
    rng = random.Random(seed)
    racing_ops = sorted({(r.first.op_name, r.first.iteration) for r in base.races}
                        | {(r.second.op_name, r.second.iteration) for r in base.races})
    while len(candidates) < budget and racing_ops:
        n = rng.randint(1, min(3, len(racing_ops)))
        d = {k: rng.uniform(1.0, 2000.0) for k in rng.sample(racing_ops, n)}
        candidates.append(("random", d, rng.uniform(0.0, 0.5), rng.randrange(2**31)))
    for source, delays, jitter, s in candidates[: max(0, budget - 1)]:
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            ex.log.append("time limit reached")
            break
        ex.tried += 1
        if progress is not None:
            progress(ex.tried, budget)
        if trial(delays, jitter, s).manifest:
            ex.found, ex.jitter, ex.seed, ex.source = delays, jitter, s, source
            ex.shrunk = shrink(delays, lambda d, j=jitter, s=s: trial(d, j, s).manifest)
            break
    ex.seconds = time.perf_counter() - t0
    return ex
