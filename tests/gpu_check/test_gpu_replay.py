"""The GPU replay's logic on CPU: SimDevice stands in for CudaDevice through the device factory.

Delay scaling, widening of tight racing pairs, the launch-cost estimate, the trial tallies, the
report rows and page, and the CLI's refusal without CUDA. The simulated device is
deterministic, so a replay on it must agree in every trial: any miss is a bug of the loop.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from overlap_harness.cli import EXIT_BAD_INPUT, main
from overlap_harness.model.errors import HarnessError
from overlap_harness.replay.plan import (
    ALLOCATOR_DEPENDENT,
    DETERMINISTIC,
    EXACT,
    FLOOR_US,
    GAP_FLOOR_US,
    GAP_ITER_SHARE,
    MANIFEST_ONLY,
    Plan,
    diff_keys,
    inverted,
    pair_gaps,
    plan_spec,
    predicted_class,
    racy_class,
    scale_delays,
    sim_run,
    tight_pairs,
)
from overlap_harness.replay.report import device_slug, passed, render_markdown, run_row, summarize
from overlap_harness.replay.suite import NOT_RUN_TIME, csan_selection, sanitize
from overlap_harness.replay.trials import Tally, TrialResult, launch_cost_us, rel_err, replay
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths

SUITE = Path(__file__).resolve().parents[2] / "scenarios"


def sim_factory(plan: Plan, delays: Mapping[tuple[str, int], float], gates=()):
    """The simulated device in CudaDevice's place: same removed syncs, launch cost, delays
    (no gates: the simulator already runs in the predicted order)."""
    from overlap_harness.sim.sim_device import SimDevice

    return SimDevice(plan.spec.removed, host_launch_us=plan.host_launch_us, delays=delays)


def spec(path: str, mutation: str) -> RunSpec:
    (sc,) = load_paths([SUITE / path])
    return next(s for s in expand(sc) if (s.mutation_name or "base") == mutation)


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    """A race-free run, a racy run made manifest by a targeted delay, a racy run that is
    manifest without delays, all planned with a GPU-like 25 µs launch cost."""
    return {
        "free": plan_spec(spec("protocol/s07_swa_mapping_war.toml", "base"), 25.0),
        "targeted": plan_spec(spec("protocol/s07_swa_mapping_war.toml", "war_barrier"), 25.0),
        "baseline": plan_spec(spec("protocol/s03_d2h_waits_publish.toml",
                                   "publish_ready.d2h_wait"), 25.0),
        "uninit": plan_spec(spec("protocol/s21_merge_prefill_skip_publish.toml",
                                 "no_poison_stale_seq_lens"), 25.0),
        "reuse": plan_spec(spec("protocol/s16_mix_running_indices_lifetime.toml",
                                "mix_running_indices.keep_alive"), 25.0),
        "cascade": plan_spec(spec("variants/seq_lens_opt_out.toml", "publish_ready.schedule_wait"),
                             196.7),
    }


def test_scale_raises_every_delay_to_the_floor_and_keeps_larger_ones() -> None:
    got = scale_delays({("verify", 3): 30.0, ("publish", 0): 2500.0}, floor_us=2000.0)
    assert got == {("verify", 3): 2000.0, ("publish", 0): 2500.0}
    assert scale_delays({("a", 1): 1500.0}, floor_us=100.0, factor=2.0) == {("a", 1): 3000.0}
    assert scale_delays({}) == {}


def test_launch_cost_of_a_simulated_run_is_its_host_launch(plans: dict[str, Plan]) -> None:
    _view, run = sim_run(plans["free"].scenario, plans["free"].spec.removed)
    assert launch_cost_us(run.timeline) == pytest.approx(25.0)
    with pytest.raises(HarnessError, match="no two consecutive stream ops"):
        launch_cost_us([])


def test_plans_classify_and_predict(plans: dict[str, Plan]) -> None:
    free, targeted, base = plans["free"], plans["targeted"], plans["baseline"]
    assert (free.kind, free.sim_verdict, free.delays) == ("race_free", "race_free", {})
    assert targeted.kind == "racy" and targeted.schedule_source.startswith("targeted")
    assert all(v >= FLOOR_US for k, v in targeted.delays.items()
               if k in (targeted.explore_delays or {}))
    assert targeted.predicted_diffs and base.predicted_diffs  # wrong values predicted
    assert base.schedule_source == "baseline"
    _view, run = sim_run(base.scenario, base.spec.removed, base.delays)
    assert base.tight_left == len(tight_pairs(run, base.margin_us, only=inverted(run)))
    assert base.inverted_pairs == len(inverted(run)) > 0


def test_widened_schedule_keeps_racing_accesses_a_model_error_apart(
        plans: dict[str, Plan]) -> None:
    """The margin dominates the model's timing error (~30% of an iteration on an H200): at
    least 3 ms and 0.75 of the simulated iteration, and every movable pair is that far apart
    in the prediction, which still shows wrong values."""
    p = plans["targeted"]
    assert p.sim is not None and p.predicted_diffs and not p.capped
    assert p.margin_us >= max(GAP_FLOOR_US, GAP_ITER_SHARE * p.sim.metrics.iteration_ns / 1000)
    _view, run = sim_run(p.scenario, p.spec.removed, p.delays)
    targets = inverted(run)
    assert targets and [need for _r, need in tight_pairs(run, p.margin_us, only=targets)
                        if need > 0] == []
    gaps = [gap for _r, gap, _m in pair_gaps(run, p.margin_us, only=targets)]
    assert p.narrowest_gap_us is not None and min(gaps) >= p.margin_us - 0.1
    # the old 300 µs margin left this pair closer than the model's error
    explored = scale_delays(p.explore_delays or {})
    _v, old = sim_run(p.scenario, p.spec.removed, explored)
    assert any(need > 0 for _r, need in tight_pairs(old, p.margin_us, only=targets))


def test_widening_moves_only_the_pairs_the_schedule_inverts(plans: dict[str, Plan]) -> None:
    """Pairs executed in issue order keep their gaps: the only delays the widening adds are
    on the later-taking-effect access of an inverted race (the 2026-11-21 wide-gaps run
    widened every pair and added many ms of delays over the iterations)."""
    for key in ("targeted", "baseline"):
        p = plans[key]
        start = scale_delays(p.explore_delays or {})
        _v, run = sim_run(p.scenario, p.spec.removed, p.delays)
        movable = {(r.first.op_name, r.first.iteration) for r in run.races if r.manifest}
        assert set(p.delays) - set(start) <= movable, key
        assert p.tight_left == 0 and not p.capped, key
    # the baseline run has pairs in issue order closer than the margin, left as they are
    b = plans["baseline"]
    _v, run = sim_run(b.scenario, b.spec.removed, b.delays)
    assert any(not r.manifest for r, _n in tight_pairs(run, b.margin_us))


def test_pairs_inverted_by_the_delays_knock_on_are_widened_too(plans: dict[str, Plan]) -> None:
    """A delay also pushes later iterations' ops and inverts pairs the starting schedule did
    not: the prediction relies on those too, so every pair it inverts ends at least a margin
    apart (the 2026-11-21 inverted-pairs run widened only the starting ones: all 10 runs that
    missed had a later-inverted pair closer than 1.5 ms, some overlapping)."""
    p = plans["cascade"]
    start = scale_delays(p.explore_delays or {})
    _v, first = sim_run(p.scenario, p.spec.removed, start)
    _v, run = sim_run(p.scenario, p.spec.removed, p.delays)
    assert p.predicted_diffs and p.tight_left == 0 and not p.capped
    assert len(inverted(run)) > len(inverted(first)) == 2  # the knock-on inverts more
    assert p.inverted_pairs == len(inverted(run))
    gaps = [g for _r, g, _m in pair_gaps(run, p.margin_us, only=inverted(run))]
    assert min(gaps) >= p.margin_us - 0.1


def test_racy_class_of_the_delayed_prediction(plans: dict[str, Plan]) -> None:
    """A racy run is judged exactly unless its delayed prediction has device-defined values
    (a reuse race alone is judged exactly); the class is recomputable from the schedule."""
    assert racy_class([], []) == EXACT
    assert racy_class(["x"], []) == f"{MANIFEST_ONLY}: reads never-written memory"
    assert racy_class(["x"], ["y"]) == \
        f"{MANIFEST_ONLY}: reads never-written memory, duplicate-index scatter"
    t, b, r = plans["targeted"], plans["baseline"], plans["reuse"]
    assert t.match_class == EXACT and plans["free"].match_class == ""
    assert b.predicted_dup_writes and b.match_class.startswith(MANIFEST_ONLY)
    assert "reuse" in r.predicted_race_kinds and not r.predicted_uninit_reads
    assert not r.predicted_dup_writes and r.match_class == EXACT
    for p in (t, b, r):
        assert predicted_class(p.scenario, p.spec.removed, p.delays) == p.match_class


def test_manifest_only_counts_wrong_values_at_the_predicted_places(
        plans: dict[str, Plan]) -> None:
    """``same_keys``: a trial whose wrong value differs from the prediction's, at the same
    place, counts for a manifest-only run, not for an exact one."""
    p = plans["targeted"]
    assert p.predicted is not None and p.oracle is not None
    got = copy.deepcopy(p.predicted.values)
    rid = next(iter(got.outcome.requests))
    ((key, _it, req),) = [k for k in diff_keys(got, p.oracle) if k[0] == "tokens"]
    toks = got.outcome.requests[req].tokens
    idx = next(i for i, (a, b) in enumerate(zip(toks, p.oracle.outcome.requests[req].tokens,
                                                strict=False)) if a != b)
    toks[idx] = toks[idx] + 1000
    assert rid and key == "tokens" and diff_keys(got, p.oracle) == \
        diff_keys(p.predicted.values, p.oracle)
    t = Tally()
    t.add(TrialResult(got, "race"), p.predicted.values, p.oracle)
    t.add(TrialResult(p.oracle, "race"), p.predicted.values, p.oracle)  # not manifest
    assert (t.equal, t.same_diffs, t.same_keys, t.manifest) == (0, 0, 1, 1)
    row = run_row(replay(p, sim_factory, trials=2, baseline_trials=1, warm_up=False))
    assert row["match_class"] == EXACT and row["hits"] == row["match"] == 2
    row["match"] = row["main"]["equal"] = 0  # wrong values, other than the predicted ones
    assert summarize([row])["racy_runs_at_target"] == 0
    row["match_class"] = f"{MANIFEST_ONLY}: reads never-written memory"
    s = summarize([row])
    assert s["racy_runs_at_target"] == s["racy_manifest_only_at_target"] == 1
    assert s["racy_exact_runs"] == 0 and passed(s)


def test_replay_on_the_simulator_agrees_in_every_trial(plans: dict[str, Plan]) -> None:
    free = replay(plans["free"], sim_factory, trials=3)
    assert free.agreement and free.main.equal == free.main.trials == 3
    assert free.main.verdicts == {"race_free": 3}
    racy = replay(plans["targeted"], sim_factory, trials=3, baseline_trials=2)
    assert racy.main.equal == racy.main.same_diffs == racy.main.manifest == 3
    assert racy.match_rate() == 1.0 and racy.main.verdicts == {"race": 3}
    assert racy.baseline is not None and racy.baseline.trials == 2
    assert racy.baseline.equal == 2  # the no-delay run is the simulator's own, too


def test_a_device_that_ignores_the_delays_is_caught(plans: dict[str, Plan]) -> None:
    def no_delays(plan: Plan, _delays: Mapping[tuple[str, int], float], _gates=()):
        return sim_factory(plan, {})

    r = replay(plans["targeted"], no_delays, trials=2, baseline_trials=1, warm_up=False)
    assert r.main.equal == 0 and r.main.first_mismatch
    assert r.match_rate() == 0.0


def test_tally_counts_errors_once_each() -> None:
    t = Tally()
    for _ in range(3):
        t.add(TrialResult(None, "error", error="CUDA error: boom"), None, None)
    assert (t.trials, t.verdicts["error"], t.errors) == (3, 3, ["CUDA error: boom"])
    assert t.median_metrics() is None


def test_report_rows_summary_and_page(plans: dict[str, Plan]) -> None:
    replays = [replay(plans["free"], sim_factory, trials=2),
               replay(plans["targeted"], sim_factory, trials=2, baseline_trials=1)]
    rows = [run_row(r) for r in replays]
    assert rows[0]["agreement"] is True and rows[1]["match"] == 2
    assert rows[1]["schedule"]["delays_us"] and rows[1]["baseline"]["trials"] == 1
    assert rows[0]["timing"]["iteration_ns"]["rel_err"] == 0.0  # same device, same model
    s = summarize(rows)
    assert (s["race_free_agreement_pct"], s["racy_runs_at_target"]) == (100.0, 1)
    assert passed(s)
    report = {"device": "sim", "driver": "-", "torch": torch.__version__, "cuda": None,
              "python": "3", "date": "2026-01-01", "command": "x", "trials": 2,
              "host_launch_us": 25.0, "floor_us": FLOOR_US, "gap_rule": "3000 µs",
              "calibration": {"cycles_per_us": 1.0}, "json_name": "x.json",
              "summary": s, "runs": rows}
    page = render_markdown(report)
    assert "| s07_swa_mapping_war[war_barrier] | race | race | race×2 | 2/2 | " in page
    assert "1/1 at ≥95%" in page


def test_runs_reading_never_written_memory_are_not_compared(plans: dict[str, Plan]) -> None:
    """A race-free run whose values the allocator decides is replayed and reported with its
    agreement, but the 100% criterion leaves it out: a disagreement there does not fail."""
    unc, free = plans["uninit"], plans["free"]
    assert unc.kind == "race_free" and unc.uninit_reads
    assert (unc.values_class, free.values_class) == (ALLOCATOR_DEPENDENT, DETERMINISTIC)
    rows = [run_row(replay(p, sim_factory, trials=2)) for p in (free, unc)]
    assert (rows[0]["values_compared"], rows[1]["values_compared"]) == (True, False)
    rows[1]["main"]["equal"] = rows[1]["agreement"] = 0  # as a GPU's allocator may make it
    s = summarize(rows)
    assert (s["race_free_runs"], s["race_free_runs_compared"]) == (2, 1)
    assert s["race_free_agreement_pct"] == 100.0 and passed(s)
    assert s["values_not_compared"][rows[1]["run_id"]]["agreeing"] == 0
    rows[0]["main"]["equal"], rows[0]["agreement"] = 1, False
    assert not passed(summarize(rows))


def test_sanitizer_selection_and_time_budget(plans: dict[str, Plan]) -> None:
    """One base run and one racy mutation a scenario; with the budget spent, no worker is
    started and every selected run says so."""
    rs = [replay(plans[k], sim_factory, trials=1, baseline_trials=1, warm_up=False)
          for k in ("free", "targeted")]
    assert [r.plan.spec.run_id for r in csan_selection(rs)] == [r.plan.spec.run_id for r in rs]
    sanitize(rs, cal=None, budget_s=0.0)
    assert [r.csan["verdict"] for r in rs] == [NOT_RUN_TIME] * 2


def test_a_sanitizer_run_over_its_time_is_tried_again_in_a_new_worker(
        plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first worker times out on the first run; a new one answers it. A run that times
    out twice is reported not run (both its workers stopped)."""
    from overlap_harness.replay import suite as gpu_suite

    started: list[FakeWorker] = []
    answers = iter([None, {"verdict": "race_free"}, None, None, {"verdict": "race"}])

    class FakeWorker:
        def __init__(self, cal: object, start_s: float) -> None:
            self.ready, self.stopped = True, False
            started.append(self)

        def ask(self, plan: Plan, limit_s: float) -> dict | None:
            return next(answers)

        def stop(self) -> None:
            self.stopped = True

    monkeypatch.setattr(gpu_suite, "_CsanProcess", FakeWorker)
    rs = [replay(plans[k], sim_factory, trials=1, baseline_trials=1, warm_up=False)
          for k in ("free", "targeted")]
    sanitize(rs, cal=None, budget_s=60.0)
    assert [r.csan["verdict"] for r in rs] == ["race_free", NOT_RUN_TIME]
    sanitize(rs[:1], cal=None, budget_s=60.0)
    assert rs[0].csan["verdict"] == "race"
    assert len(started) == 4 and all(w.stopped for w in started)


def test_device_slug_and_rel_err() -> None:
    assert device_slug("NVIDIA H200") == "h200"
    assert device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert device_slug("NVIDIA H100 PCIe") == "h100"
    assert device_slug("AMD Instinct MI300X") == "mi300x"
    assert device_slug("NVIDIA GeForce RTX 4090") == "4090"
    assert device_slug("Some Accelerator") == "accelerator"
    assert rel_err(110.0, 100.0) == pytest.approx(0.1) and rel_err(1.0, 0.0) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_gpu_check_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu-check", str(SUITE)]) == EXIT_BAD_INPUT
    assert "gpu-check needs a CUDA device" in capsys.readouterr().err
