"""ProfiledSimDevice, the harness fit from timelines, and predicted-vs-measured on the CPU.

The "GPU" here is a SimDevice with a 150 µs launch cost: a profile fitted on its timelines
must predict it exactly, so the whole chain (fit, costs, profiled simulation, comparison)
is checked without a GPU.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from overlap_harness.gpu_check.profiling import (
    harness_from_timelines,
    idle_sync_spans,
    timelines_from_data,
    timelines_to_data,
)
from overlap_harness.model.metrics import compute_metrics
from overlap_harness.model.profile import Figure, Mode, costs_from_profile, profile_from_dict
from overlap_harness.model.trace import HOST, OpId, OpKind, OpRecord
from overlap_harness.profile_check import compare_command, predict_report, summarize
from overlap_harness.runner import simulate
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_paths
from overlap_harness.sim.profiled import ProfiledSimDevice
from tests.calibration.synthetic import profile_doc

LAUNCH_US = 150.0
SUITE_RUN = "scenarios/protocol/s03_d2h_waits_publish.toml"  # held out: not a calibration run


def _runs(paths, launch_us):
    out = []
    for sc in load_paths(paths):
        for spec in expand(sc):
            s = dataclasses.replace(spec.scenario, protocol=spec.protocol)
            timed = dataclasses.replace(s, timing=dataclasses.replace(s.timing,
                                                                      host_launch=launch_us))
            out.append((spec, timed))
    return out


def _pairs(paths):
    pairs = []
    for spec, timed in _runs(paths, LAUNCH_US):
        _, measured = simulate(timed, spec.removed, jitter=0.0)
        _, plain = simulate(dataclasses.replace(timed, timing=spec.scenario.timing),
                            spec.removed, jitter=0.0)
        pairs.append((measured.finish().timeline, plain.finish().timeline))
    return pairs


@pytest.fixture(scope="module")
def fitted():
    """A profile whose harness group is fitted on the calibration scenarios run on a
    SimDevice with a 150 µs launch cost."""
    issue, extra, by_op, extra_by_op = harness_from_timelines(_pairs(["profiles/calibration"]))
    doc = profile_doc()
    doc["harness"] = {k: {n: dataclasses.asdict(f) for n, f in v.items()} for k, v in
                      (("issue_us", issue), ("extra_us", extra), ("issue_by_op_us", by_op),
                       ("extra_by_op_us", extra_by_op))}
    return profile_from_dict(doc)


def test_fit_reads_the_launch_cost_off_the_timelines(fitted):
    for kind in ("kernel", "copy", "record", "wait"):
        assert fitted.harness_issue_us[kind].median == LAUNCH_US
    assert fitted.harness_issue_us["host_read"].median == 0.0
    assert fitted.harness_extra_us["kernel"].median == 0.0
    assert fitted.harness_issue_by_op_us["kernel:build_seq_lens"].median == LAUNCH_US


def test_profiled_device_predicts_a_held_out_run_exactly(fitted):
    (spec, timed), *_ = _runs([SUITE_RUN], LAUNCH_US)
    _, reference = simulate(timed, spec.removed, jitter=0.0)
    want = compute_metrics(reference.finish().timeline)
    costs = costs_from_profile(fitted, spec.scenario.timing, Mode.REPLAY)
    dev = ProfiledSimDevice(spec.removed, costs=costs)
    from overlap_harness.model.protocol import run_protocol
    run_protocol(dev, dataclasses.replace(timed, timing=costs.timing))
    assert compute_metrics(dev.finish().timeline) == want


def _two_op_program(dev, k_cost_us):
    s = dev.stream("forward")
    buf = dev.buffer("x", (4,), torch.int32, fill=0, stream=s)  # an alloc and a fill kernel
    dev.set_iteration(0)
    dev.launch(s, "k", lambda x: x + 1, reads=[buf], writes=[buf], cost_us=k_cost_us)
    dev.synchronize(s, label="d2h.host_sync")
    dev.launch(s, "k2", lambda x: x + 1, reads=[buf], writes=[buf], cost_us=10.0)
    return dev.finish()


@pytest.mark.parametrize(("removed", "k_cost_us", "sync_span", "k2_issue"), [
    ((), 10.0, (400_000, 407_000), 527_000),  # k ended at 340 µs: the sync blocks its span
    ((), 500.0, (400_000, 830_000), 950_000),  # k ends at 830 µs (300 + 500 + 30 extra)
    (("d2h.host_sync",), 10.0, None, 400_000),  # not issued: no pre-cost, span or return
])
def test_a_sync_costs_its_span_and_return_only_when_issued(removed, k_cost_us, sync_span,
                                                            k2_issue):
    costs = dataclasses.replace(
        costs_from_profile(profile_from_dict(profile_doc(harness_us=100.0)), mode=Mode.REPLAY),
        sync_span_us=7.0, sync_return_us=20.0)
    run = _two_op_program(ProfiledSimDevice(removed, costs=costs), k_cost_us)
    k2 = next(r for r in run.timeline if r.name == "k2")
    syncs = [(r.start_ns, r.end_ns) for r in run.timeline if r.kind == OpKind.HOST_SYNC]
    # alloc, fill, k: 100 µs each; then the sync's pre-cost 100, its span, a 20 µs return
    assert syncs == ([] if sync_span is None else [sync_span])
    assert k2.issue_ns == k2_issue


def _rec(op, kind, agent, issue, start, end):
    return OpRecord(OpId(op), f"op{op}", agent, kind, issue, start, end, None, 0)


def test_idle_sync_spans_keep_syncs_with_nothing_pending():
    tl = [_rec(0, OpKind.KERNEL, "s", 0, 0, 50), _rec(1, OpKind.HOST_SYNC, HOST, 10, 10, 50),
          _rec(2, OpKind.HOST_SYNC, HOST, 60, 60, 67)]
    assert idle_sync_spans(tl) == [0.007]


def test_timelines_round_trip():
    pairs = [([_rec(0, OpKind.KERNEL, "s", 0, 1, 2)], [_rec(0, OpKind.KERNEL, "s", 0, 1, 3)])]
    assert timelines_from_data(json.loads(json.dumps(timelines_to_data(pairs)))) == pairs


def _fake_report(launch_us):
    runs = []
    for spec, timed in _runs([SUITE_RUN], launch_us):
        _, dev = simulate(timed, spec.removed, jitter=0.0)
        m = compute_metrics(dev.finish().timeline)
        timing = {k: {"sim": getattr(m, k) // 2, "gpu": getattr(m, k)}
                  for k in ("iteration_ns", "host_stall_ns", "forward_idle_ns")}
        runs.append({"run_id": spec.run_id, "kind": "race_free", "timing": timing,
                     "main": {"delays_us": {}}})
    return {"device": "SimDevice", "date": "today", "runs": runs}


def test_compare_predicts_the_fake_gpu_and_writes_page_json_plot(fitted, tmp_path):
    report = tmp_path / "r.json"
    report.write_text(json.dumps(_fake_report(LAUNCH_US)))
    profile = tmp_path / "p.json"
    from overlap_harness.model.profile import dump_profile
    dump_profile(fitted, profile)
    assert compare_command(str(report), str(profile), [SUITE_RUN], str(tmp_path)) == 0
    doc = json.loads((tmp_path / "r-vs-p.json").read_text())
    assert doc["summary"]["iteration_ns"]["max_abs_rel_err"] == 0.0
    assert doc["summary"]["iteration_ns"]["before_median_abs_rel_err"] == pytest.approx(0.5,
                                                                                       abs=1e-3)
    assert (tmp_path / "r-vs-p.png").stat().st_size > 10_000
    assert "targets met" in (tmp_path / "r-vs-p.md").read_text()


def test_compare_misses_when_the_gpu_is_slower(fitted):
    report = _fake_report(2 * LAUNCH_US)
    specs = {s.run_id: s for sc in load_paths([SUITE_RUN]) for s in expand(sc)}
    summary = summarize(predict_report(report, fitted, specs))
    assert not summary["targets_met"]
    assert summary["iteration_ns"]["median_abs_rel_err"] > 0.2


def test_figure_zero_for_kinds_without_samples(fitted):
    assert fitted.harness_issue_us["alloc"] == Figure(0.0, 0.0, 0.0, 1)
