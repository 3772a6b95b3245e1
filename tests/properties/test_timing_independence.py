"""The race set of every bundled run is the same under every timing (issue 13).

Each run of the suite (base and every mutation) is simulated with its own timing and again
with all durations x0.25 and x4, host launch and schedule_prep x20, and jitter 0.5 under three
seeds; the race sets (kind, buffer, both ops, both iterations, elements) must be identical.
CI runs a fixed sample (every run, two variants each, rotating so every variant is used);
``-m slow`` runs the full sweep.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from overlap_harness.model.errors import HarnessError
from overlap_harness.runner import canonical_races, simulate
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths
from tests.properties.timing import VARIANTS, race_set, retimed

SUITE = Path(__file__).resolve().parents[2] / "scenarios"
SPECS: list[RunSpec] = [spec for sc in load_paths([SUITE]) for spec in expand(sc)]
NAMES = list(VARIANTS)


def _races(spec: RunSpec, variant: str | None):
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    seed = None
    if variant is not None:
        scenario, seed = retimed(scenario, variant)
    try:
        _outcome, dev = simulate(scenario, spec.removed, seed=seed)
        races = canonical_races(scenario, spec.removed, dev.finish(), seed=seed)
    except HarnessError as error:  # a refused run (S aliasing F) is refused under any timing
        return ("refused", type(error).__name__)
    return race_set(races)


def _check(spec: RunSpec, variants: list[str]) -> None:
    reference = _races(spec, None)
    for variant in variants:
        got = _races(spec, variant)
        if got != reference and isinstance(got, frozenset) and isinstance(reference, frozenset):
            lost, gained = sorted(reference - got)[:3], sorted(got - reference)[:3]
            pytest.fail(f"{spec.scenario.name}[{spec.mutation_name or 'base'}] under {variant}: "
                        f"lost {len(reference - got)} {lost}, gained {len(got - reference)} "
                        f"{gained}")
        assert got == reference, f"{spec.run_id} under {variant}: {got} != {reference}"


def test_the_sample_covers_every_variant_and_every_run() -> None:
    assert len(SPECS) >= 90
    used = {NAMES[(2 * i + k) % len(NAMES)] for i in range(len(SPECS)) for k in (0, 1)}
    assert used == set(NAMES)


@pytest.mark.parametrize("index", range(len(SPECS)),
                         ids=[f"{s.scenario.name}[{s.mutation_name or 'base'}]" for s in SPECS])
def test_race_set_is_the_same_under_two_other_timings(index: int) -> None:
    _check(SPECS[index], [NAMES[(2 * index + k) % len(NAMES)] for k in (0, 1)])


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SPECS)),
                         ids=[f"{s.scenario.name}[{s.mutation_name or 'base'}]" for s in SPECS])
def test_race_set_is_the_same_under_every_timing(index: int) -> None:
    _check(SPECS[index], NAMES)
