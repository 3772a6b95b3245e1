"""Both outcomes of a branching query are explored; a race one outcome has names it."""

from __future__ import annotations

import torch

from overlap_harness.outcomes import explore_outcomes
from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64


def _program(fixed: bool):
    """If the copy looks done, the host reads the pinned result at once (racy: nothing but a
    timing made it true, unless ``fixed`` polls first); otherwise it synchronizes, then reads."""

    def run(outcomes):
        dev = SimDevice(host_launch_us=1.0, query_outcomes=outcomes)
        s = dev.stream("s")
        pin = dev.buffer("pin", (2,), I64, pinned=True, fill=0)
        b = dev.buffer("b", (2,), I64, fill=3, stream=s)
        done = dev.event("copy_done")
        dev.copy(s, b, pin, non_blocking=True, cost_us=10)
        dev.record(done, s)
        if fixed:
            dev.poll(done)
            dev.host_read(pin, name="read_early")
        elif dev.query(done):
            dev.host_read(pin, name="read_early")
        else:
            dev.synchronize(done)
            dev.host_read(pin, name="read_late")
        run_result = dev.finish()
        return run_result.races, run_result.query_sites

    return run


def test_the_false_outcome_alone_hides_nothing_here_but_true_is_also_explored() -> None:
    report = explore_outcomes(_program(fixed=False))
    assert [sorted(a.values()) for a in report.assignments] == [[False], [True]]
    assert not report.truncated
    # a True answer orders the read after the copy (an observation): race-free both ways
    assert report.races == []


def _branchy(outcomes):
    """A race only the True branch has: it frees a buffer F still reads, and reuses it."""
    dev = SimDevice(host_launch_us=1.0, query_outcomes=outcomes)
    s, f = dev.stream("s"), dev.stream("f")
    b = dev.buffer("b", (2,), I64, fill=1, stream=s)
    probe = dev.event("probe")
    dev.record(probe, s)
    dev.wait_stream(f, s)  # the fill is in place before F reads b
    dev.launch(f, "use", lambda v: (), reads=[b], cost_us=50)
    if dev.query(probe):
        dev.free(b)
        c = dev.buffer("c", (2,), I64, stream=s)
        dev.launch(s, "overwrite", lambda: torch.zeros(2, dtype=I64), writes=[c])
    run_result = dev.finish()
    return run_result.races, run_result.query_sites


def test_a_race_only_one_outcome_has_is_reported_with_that_outcome_named() -> None:
    report = explore_outcomes(_branchy)
    (race,) = report.races
    assert str(race.kind) == "reuse"
    assert race.needs == ("query(probe)@-1#0 = True",)
    assert "only when query(probe)@-1#0 = True" in race.describe()
    # the default run alone (outcome False) has no race at all
    races, _sites = _branchy({})
    assert races == []


def test_the_search_stops_at_its_budget_and_says_so() -> None:
    report = explore_outcomes(_program(fixed=False), max_runs=1)
    assert report.truncated and len(report.assignments) == 1


def test_a_poll_loop_has_one_outcome() -> None:
    report = explore_outcomes(_program(fixed=True))
    assert len(report.assignments) == 1 and report.races == []
