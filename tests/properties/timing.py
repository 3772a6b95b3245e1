"""Timing variants and race sets for the timing-independence property (issue 13).

The race set is what a verdict is made of: (kind, buffer, both ops' names, both iterations,
elements). Whether a race was latent or manifest may change with timing; the set may not.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from overlap_harness.model.config import Scenario, Timing
from overlap_harness.model.trace import Race

RaceKey = tuple[str, str, str, int, str, int, tuple[int, ...]]


def race_key(race: Race) -> RaceKey:
    """What must not depend on timing: everything but the manifest flag and the times."""
    return (str(race.kind), race.buffer, race.first.op_name, race.first.iteration,
            race.second.op_name, race.second.iteration, race.elements)


def race_set(races: Iterable[Race]) -> frozenset[RaceKey]:
    """The set of race keys of a run."""
    return frozenset(race_key(r) for r in races)


def _durations(timing: Timing, factor: float) -> Timing:
    return dataclasses.replace(
        timing, process_results=timing.process_results * factor,
        schedule_kernel=timing.schedule_kernel * factor, forward=timing.forward * factor,
        d2h=timing.d2h * factor)


def _slow_host(timing: Timing) -> Timing:
    return dataclasses.replace(timing, host_launch=timing.host_launch * 20,
                               schedule_prep=timing.schedule_prep * 20)


#: name -> (timing transform, seed or None to keep the scenario's)
VARIANTS: dict[str, tuple[Callable[[Timing], Timing], int | None]] = {
    "durations x0.25": (lambda t: _durations(t, 0.25), None),
    "durations x4": (lambda t: _durations(t, 4.0), None),
    "host launch and schedule_prep x20": (_slow_host, None),
    **{f"jitter 0.5 seed {seed}": (lambda t: dataclasses.replace(t, jitter=0.5), seed)
       for seed in (1, 2, 3)},
}


def retimed(scenario: Scenario, variant: str) -> tuple[Scenario, int | None]:
    """``scenario`` with ``variant``'s timing, and the seed to run it with."""
    transform, seed = VARIANTS[variant]
    return dataclasses.replace(scenario, timing=transform(scenario.timing)), seed
