"""The garbage collector's settings while a suite runs (issue 17: collections were 0.4 of the
suite's 7 CPU s in one process, and 0.15 s more while torch loaded): the command line pauses
the collector while the modules of a run load, and ``run_scenarios`` collects the young
generation less often while it runs; both leave the process's settings as they found them."""

from __future__ import annotations

import gc

import pytest

from overlap_harness import cli, runner
from overlap_harness.model.config import Request, Scenario, Workload

SMALL = Scenario(name="small", workload=Workload(
    iterations=2, requests=(Request(id="A", arrive=0, prompt_len=3, max_new=2),)))


@pytest.fixture
def thresholds():
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_runs_collect_less_often_and_the_thresholds_come_back(thresholds) -> None:
    gc.set_threshold(700, 9, 8)
    seen = []
    results = runner.run_scenarios([SMALL], on_result=lambda r: seen.append(gc.get_threshold()))
    assert [r.verdict for r in results] == ["race_free"]
    assert seen == [(runner.GC_THRESHOLD_0, 9, 8)]
    assert gc.get_threshold() == (700, 9, 8)


def test_a_failing_run_gives_the_thresholds_back_too(thresholds) -> None:
    gc.set_threshold(700, 9, 8)

    def stop(_result) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_scenarios([SMALL], on_result=stop)
    assert gc.get_threshold() == (700, 9, 8)


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_while_modules_load_then_as_before(enabled) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        frozen = gc.get_freeze_count()
        with cli._collector_paused():
            assert not gc.isenabled()
            made = [[] for _ in range(100)]  # as a module's import would: long-lived
        assert gc.isenabled() is enabled
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        (gc.enable if was else gc.disable)()
