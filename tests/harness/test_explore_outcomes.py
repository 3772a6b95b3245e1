"""``explore`` covers both answers of a branching query (issue 13): a race only the True
branch has is found and named, for a run whose default answer (False) is race-free."""

from __future__ import annotations

from pathlib import Path

import torch

from overlap_harness import runner
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]
I64 = torch.int64


def _branching_program(dev, _scenario):
    """A stand-in for the protocol: if a probe says the schedule stream is done, the host
    frees a buffer the forward stream still reads and reuses its block on S."""
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("relay", (2,), I64, fill=1, stream=s)
    probe = dev.event("probe")
    dev.record(probe, s)
    dev.wait_stream(f, s)
    dev.launch(f, "consume", lambda v: (), reads=[b], cost_us=50)
    if dev.query(probe):
        dev.free(b)
        c = dev.buffer("next", (2,), I64, stream=s)
        dev.launch(s, "overwrite", lambda: torch.zeros(2, dtype=I64), writes=[c])


def test_outcome_races_name_the_answer_a_race_needs(monkeypatch) -> None:
    monkeypatch.setattr(runner, "run_protocol", _branching_program)
    (spec,) = expand(load_scenario(ROOT / "scenarios/variants/bootstrap.toml"))[:1]
    (race,) = runner.outcome_races(spec)
    assert str(race.kind) == "reuse" and race.reused_as == "next"
    assert race.needs == ("query(probe)@-1#0 = True",)
    _outcome, dev = runner.simulate(spec.scenario, spec.removed)
    assert dev.finish().races == []  # the default answer alone is race-free


def test_a_run_without_branching_queries_explores_no_outcomes() -> None:
    (spec,) = expand(load_scenario(ROOT / "scenarios/variants/bootstrap.toml"))[:1]
    assert runner.run_spec(spec).query_sites == []
    assert runner.outcome_races(spec) == []
