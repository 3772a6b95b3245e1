"""The timing model on the CPU: the profile's timing group (read, written, refused with one
line), the SYSTEM costs it gives, what ProfiledSimDevice charges with them (a hand-worked
timeline), the group fitted from samples, and the scenario's ``profile`` key."""

from __future__ import annotations

import json

import pytest
import torch

from overlap_harness.calibrate_cmd import apply_profile, main
from overlap_harness.model.config import Timing
from overlap_harness.model.op_list import ReplayCall, after_wait, return_costs, timing_costs
from overlap_harness.model.profile import (
    Mode,
    ProfileError,
    costs_from_profile,
    load_profile,
    profile_from_dict,
    profile_to_dict,
)
from overlap_harness.model.trace import OpKind
from overlap_harness.scenarios.loader import ScenarioError, load_scenario
from overlap_harness.sim.profiled import ProfiledSimDevice
from overlap_harness.timing_check import group_from_samples, predict, run_kind, suite_specs
from tests.calibration.synthetic import fig, profile_doc


def timing_doc() -> dict:
    """A profile with a timing group of easy numbers."""
    doc = profile_doc()
    doc["timing"] = {
        "fitted_on": "synthetic",
        "call_us": {"kernel": fig(10.0), "copy_d2h": fig(20.0), "record": fig(3.0)},
        "figures": {"kernel_extra": fig(1.0), "sync_idle": fig(5.0), "sync_wake": fig(7.0),
                    "start_gap": fig(2.0), "wait_gap": fig(4.0),
                    "start_lag": {"median": -1.0, "p10": -2.0, "p90": 0.0, "n": 3},
                    "sync_return": fig(6.0), "copy_return": fig(8.0)},
        "kernel_extra_by_op_us": {"kernel:slow": fig(3.0)},
        "copy_us": {"d2h": fig(1.5)},
        "mean_us": {"kernel": 12.0, "sync_wake": 9.0},
        "gap_by_op_us": {}, "gap_by_transition_us": {"kernel->copy": 5.0},
    }
    return doc


def test_timing_group_round_trips_and_gives_system_costs():
    profile = profile_from_dict(timing_doc())
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(profile)))) == profile
    costs = costs_from_profile(profile, Timing(), Mode.SYSTEM)
    # means win over medians; kinds the group lacks cost nothing; a sync's span is its own
    assert costs.host_issue_us["kernel"] == 12.0
    assert costs.host_issue_us["copy_d2h"] == 20.0
    assert costs.host_issue_us["wait_event"] == 0.0
    assert costs.host_issue_us["synchronize"] == 0.0
    assert (costs.sync_span_us, costs.sync_wake_us, costs.sync_return_us,
            costs.copy_return_us) == (5.0, 9.0, 6.0, 8.0)
    assert costs.copy_us == {"d2h": 1.5}
    assert costs.op_extra_us == {"kernel:slow": 3.0}
    assert costs.gap_by_transition_us == {"kernel->copy": 5.0}
    assert costs.timing.host_launch == 12.0 and costs.timing.d2h == 1.5
    assert costs.timing.forward == Timing().forward  # the workload's costs stay


def test_a_profile_without_timing_group_keeps_the_old_system_costs():
    costs = costs_from_profile(profile_from_dict(profile_doc()), Timing(), Mode.SYSTEM)
    assert costs.copy_us == {} and costs.sync_wake_us == 0.0


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t["figures"].pop("sync_idle"), "timing.figures: missing sync_idle"),
    (lambda t: t["call_us"].update(launch=fig(1.0)), "timing.call_us.launch: unknown key"),
    (lambda t: t["mean_us"].update(kernel="fast"), "timing.mean_us.kernel: expected a finite"),
    (lambda t: t["copy_us"].update(d2h=fig(-1.0)), "timing.copy_us.d2h.median: expected a "
                                                   "finite number >= 0"),
])
def test_bad_timing_group_is_one_line(edit, message, tmp_path):
    doc = timing_doc()
    edit(doc["timing"])
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_profiled_device_charges_the_timing_costs():
    costs = costs_from_profile(profile_from_dict(timing_doc()), Timing(), Mode.SYSTEM)
    dev = ProfiledSimDevice(costs=costs)
    f = dev.stream("forward")
    src = dev.buffer("src", (2,), torch.int64)
    dst = dev.buffer("dst", (2,), torch.int64, pinned=True)
    dev.launch(f, "k", lambda: 1, writes=[src], cost_us=100.0)  # host 0 -> 12; runs 12-113
    dev.copy(f, src, dst, non_blocking=True, cost_us=50.0)  # host -> 32; runs 113-114.5
    dev.synchronize(f)  # waits 32 -> 114.5 + wake 9 = 123.5; return 6 -> 129.5
    dev.launch(f, "slow", lambda: 1, writes=[src], cost_us=10.0)  # host 141.5; runs 10 + 3
    tl = dev.finish().timeline
    spans = [(r.kind, r.start_ns, r.end_ns) for r in tl]
    assert spans == [(OpKind.KERNEL, 12_000, 113_000), (OpKind.COPY, 113_000, 114_500),
                     (OpKind.HOST_SYNC, 32_000, 123_500), (OpKind.KERNEL, 141_500, 154_500)]


def test_a_sync_with_nothing_to_wait_for_costs_its_span():
    costs = costs_from_profile(profile_from_dict(timing_doc()), Timing(), Mode.SYSTEM)
    dev = ProfiledSimDevice(costs=costs)
    f = dev.stream("forward")
    dev.synchronize(f)
    (sync,) = dev.finish().timeline
    assert (sync.start_ns, sync.end_ns) == (0, 5_000)  # the span, no wake: nothing waited


def test_after_wait_and_return_costs():
    calls = [ReplayCall("kernel", "a", stream="F"), ReplayCall("copy", "b", stream="F"),
             ReplayCall("wait_event", "w", stream="F", event="e#0"),
             ReplayCall("kernel", "c", stream="F"), ReplayCall("kernel", "d", stream="S")]
    assert after_wait(calls) == [(False, "none->kernel"), (False, "kernel->copy"),
                                 (True, "copy->kernel"), (False, "none->kernel")]
    after = [("sync", [("kernel", 14.0), ("record", 5.0)]), ("copy", [("kernel", 10.0)])]
    assert return_costs(after, {"kernel": 10.0, "record": 3.0}) == {"sync": [6.0],
                                                                    "copy": [0.0]}


def test_group_from_samples_takes_means_and_pools_kernel_extra():
    calls = [ReplayCall("kernel", "a", stream="forward", cost_us=10.0),
             ReplayCall("kernel", "b", stream="forward", cost_us=10.0),
             ReplayCall("synchronize", "s", stream="forward", other="stream")]
    stamps = [0, 30_000, 40_000, 60_000]
    spans = {"forward": [(31_000, 42_000), (44_000, 56_000)]}
    group = group_from_samples(timing_costs([(calls, stamps, spans)]), "hand")
    assert group.mean_us["kernel"] == 20.0  # 30 and 10 µs calls
    assert group.call_us["kernel"].median == 20.0
    assert group.figures["kernel_extra"].median == 1.5  # 1 and 2 µs beyond 10
    assert group.mean_us["start_gap"] == 2.0  # b issued (40) before a ended (42): 44 - 42
    assert group.figures["start_lag"].median == 1.0  # a: 31 - 30
    assert group.mean_us["sync_wake"] == 4.0  # the sync returned at 60, F ended at 56
    assert group.figures["sync_idle"] == group.figures["sync_idle"].__class__(0.0, 0.0, 0.0, 1)
    assert group.gap_by_transition_us == {"kernel->kernel": 2.0}


def _scenario_file(folder, profile_line: str):
    path = folder / "one.toml"
    path.write_text(f'name = "one"\n{profile_line}\n[workload]\niterations = 2\n'
                    '[[workload.requests]]\nid = "A"\n')
    return path


def test_a_scenario_names_a_profile_relative_to_its_file(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(timing_doc()))
    scenario = load_scenario(_scenario_file(tmp_path, 'profile = "p.json"'))
    assert scenario.profile == "p.json"
    assert apply_profile(scenario, None).timing.host_launch == 12.0
    assert apply_profile(scenario, None).timing.forward == scenario.timing.forward


def test_a_missing_profile_is_a_scenario_error(tmp_path):
    with pytest.raises(ScenarioError) as err:
        load_scenario(_scenario_file(tmp_path, 'profile = "gone.json"'))
    assert "profile" in str(err.value) and "no such profile file" in str(err.value)


def _measurement(profile_path, scale: float) -> dict:
    """A timing measurement of the calibration workloads whose replays are the profile's own
    predictions times ``scale`` (three identical replays a run)."""
    profile = load_profile(profile_path)
    runs = []
    for spec in suite_specs(["profiles/calibration"]):
        predicted = predict(spec, profile)
        runs.append({"run_id": spec.run_id, "kind": run_kind(spec), "calls": 1,
                     "repeats": [{k: round(v * scale) for k, v in predicted.items()}] * 3})
    return {"kind": "timing-measurement", "device": "Synthetic GPU", "date": "2026-11-23",
            "repeats": 3, "runs": runs}


@pytest.mark.parametrize(("scale", "status"), [(1.0, 0), (1.5, 1)])
def test_timing_compare_holds_a_profile_to_a_measurement(scale, status, tmp_path):
    profile = tmp_path / "synthetic.json"
    profile.write_text(json.dumps(timing_doc()))
    measurement = tmp_path / "m-timing.json"
    measurement.write_text(json.dumps(_measurement(profile, scale)))
    assert main(["--timing-compare", str(measurement), "--profile", str(profile),
                 "profiles/calibration"]) == status
    doc = json.loads((tmp_path / "m-timing-vs-synthetic.json").read_text())
    errors = [r["metrics"]["iteration_ns"]["rel_err"] for r in doc["rows"]]
    assert len(errors) == 5 and all(abs(e - (1 / scale - 1)) < 1e-3 for e in errors)
    assert doc["noise_floor"]["iteration_ns"]["max"] == 0.0  # identical replays
    assert (tmp_path / "m-timing-vs-synthetic.png").is_file()
