"""The bundled suite: every run's computed verdict equals its expectation, and every
race-expecting run has a race-free twin in the same scenario (the sync put back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.model.config import Expect
from overlap_harness.runner import run_scenarios
from overlap_harness.scenarios.loader import load_paths

SUITE = Path(__file__).resolve().parents[2] / "scenarios"
# the SGLang conformance's model scenarios: a label only they remove is removed somewhere too
CONFORMANCE = (Path(__file__).resolve().parents[2] / "overlap_harness" / "conformance"
               / "model_scenarios")


@pytest.fixture(scope="module")
def results():
    return run_scenarios(load_paths([SUITE]))


def test_the_suite_has_at_least_40_scenarios() -> None:
    assert len(load_paths([SUITE])) >= 40


def test_every_verdict_matches_its_expectation(results) -> None:
    bad = [f"{r.name}: expected {r.expect}, computed {r.verdict}, missing {r.missing}"
           f"{' error ' + r.error if r.error else ''}" for r in results if not r.ok]
    assert bad == []


def test_every_racy_run_has_a_race_free_twin(results) -> None:
    by_scenario: dict[str, list] = {}
    for r in results:
        by_scenario.setdefault(r.scenario, []).append(r)
    for name, runs in by_scenario.items():
        verdicts = {r.verdict for r in runs}
        if verdicts & {str(Expect.RACE), str(Expect.FAULT)}:
            assert str(Expect.RACE_FREE) in verdicts, f"{name} has no race-free twin"


def test_every_removal_is_caught_and_vanishes_with_the_sync_back(results) -> None:
    base = {r.scenario: r for r in results if not r.mutation}
    for r in results:
        if r.removed and r.expect == str(Expect.RACE):
            assert r.races, r.name  # computed by the detector
            twin = base[r.scenario]
            if twin.expect == str(Expect.RACE_FREE):
                assert twin.races == [], twin.name  # the same program with the sync kept


def test_each_sync_label_the_model_uses_is_removed_somewhere(results) -> None:
    """By the bundled suite, or by the conformance's model scenarios in a run that reaches it
    (``mix_running_indices.record_stream`` alone: SGLang's own call, held by the ring)."""
    removed = {label for r in results for label in r.removed}
    used = {label for r in results for label in r.labels_used}
    conformance = run_scenarios(load_paths([CONFORMANCE]))
    removed |= {label for r in conformance for label in set(r.removed) & set(r.labels_used)}
    assert used - removed == set()
    must = {"forward_entry", "war_barrier", "publish_ready.schedule_wait",
            "publish_ready.d2h_wait", "d2h.host_sync", "copy_done.host_sync",
            "verify_done.schedule_wait", "future_indices.record_stream", "batch_pin_ring"}
    assert must <= removed
