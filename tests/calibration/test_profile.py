"""The profile file: loading good and bad files (one-line errors) and the costs it gives."""

from __future__ import annotations

import json

import pytest

from overlap_harness.model.config import Timing
from overlap_harness.model.profile import (
    Figure,
    Mode,
    ProfileError,
    SizePoint,
    costs_from_profile,
    dump_profile,
    fit_sizes,
    load_profile,
    profile_from_dict,
)
from tests.calibration.synthetic import profile_doc


def write(tmp_path, doc, name="p.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def test_good_file_loads_and_round_trips(tmp_path):
    path = write(tmp_path, profile_doc())
    profile = load_profile(path)
    assert profile.device == "Synthetic GPU"
    assert profile.system_issue_us["kernel_launch"] == Figure(4.0, 3.0, 5.0, 10)
    assert profile.harness_issue_us["sync_return"].median == 20.0
    assert [p.bytes for p in profile.durations["gather"]] == [4096, 65536, 1 << 20]
    again = tmp_path / "again.json"
    dump_profile(profile, again)
    assert load_profile(again) == profile


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format="v0"),
     "format: expected 'overlap-harness-profile/1', got 'v0'"),
    (lambda d: d.pop("driver"), "driver: expected a non-empty string, got None"),
    (lambda d: d["system"]["issue_us"].pop("query"),
     "system.issue_us.query: missing (every one of kernel_launch|h2d_pinned|h2d_pageable|"
     "d2h_pinned|d2h_pageable|event_record|wait_event|wait_stream|query|synchronize|"
     "record_stream is needed)"),
    (lambda d: d["system"]["issue_us"]["query"].update(p10=9.0),
     "system.issue_us.query: expected p10 <= median <= p90, got 9, 4, 5"),
    (lambda d: d["harness"]["extra_us"].update(dma=d["harness"]["extra_us"]["copy"]),
     "harness.extra_us.dma: unknown kind; expected one of kernel|copy"),
    (lambda d: d["system"]["durations"]["fill"][0].update(bytes=-1),
     "system.durations.fill[0].bytes: expected an integer >= 0, got -1"),
    (lambda d: d["harness"]["issue_us"]["kernel"].update(n=0),
     "harness.issue_us.kernel.n: expected an integer >= 1, got 0"),
    (lambda d: d.update(sleep_cycles_per_us=0),
     "sleep_cycles_per_us: expected a number > 0, got 0"),
])
def test_bad_file_gives_one_line(tmp_path, edit, message):
    doc = profile_doc()
    edit(doc)
    path = write(tmp_path, doc)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value) == f"{path}: {message}"


def test_several_problems_are_counted_on_the_one_line(tmp_path):
    doc = profile_doc()
    doc.pop("device")
    doc.pop("torch")
    path = write(tmp_path, doc)
    with pytest.raises(ProfileError, match=r"device: expected .* \(and 1 more\)$") as err:
        load_profile(path)
    assert "\n" not in str(err.value)


def test_unreadable_and_not_json(tmp_path):
    with pytest.raises(ProfileError, match=r"missing.json: cannot read the profile: "):
        load_profile(tmp_path / "missing.json")
    path = write(tmp_path, "{not json")
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value) == f"{path}: not JSON: Expecting property name enclosed in double " \
                             "quotes at line 1"
    with pytest.raises(ProfileError, match="expected a JSON object at the top"):
        profile_from_dict([1, 2], "x.json")


def test_figure_quantiles():
    assert Figure.of([4, 1, 3, 2, 5]) == Figure(3.0, 1.4, 4.6, 5)
    assert Figure.of([7]) == Figure(7.0, 7.0, 7.0, 1)
    with pytest.raises(ValueError, match="at least one sample"):
        Figure.of([])


def test_fit_sizes_line_and_single_point():
    pts = [SizePoint(b, Figure(5 + b / 1024 * 0.5, 0, 99, 1)) for b in (1024, 4096, 10240)]
    fit = fit_sizes(pts)
    assert fit.base_us == pytest.approx(5.0)
    assert fit.per_kib_us == pytest.approx(0.5)
    assert fit.at(2048) == pytest.approx(6.0)
    assert fit_sizes(pts[:1]).per_kib_us == 0.0


def test_system_costs():
    profile = profile_from_dict(profile_doc(system_us=4.0))
    base = Timing(schedule_prep=123.0, forward=999.0)
    costs = costs_from_profile(profile, base, Mode.SYSTEM)
    assert costs.timing.host_launch == 4.0
    assert costs.timing.schedule_kernel == pytest.approx(5.04)  # 5 + 4 KiB * 0.01
    assert costs.timing.d2h == pytest.approx(5.04)
    assert (costs.timing.schedule_prep, costs.timing.forward) == (123.0, 999.0)
    assert costs.host_issue_us["copy_d2h"] == 4.0
    assert costs.host_issue_us["host_read"] == 0.0
    assert costs.host_issue_us["synchronize"] == 0.0
    assert costs.sync_span_us == 4.0  # an idle sync's cost is its shortest span
    assert costs.sync_return_us == 8.0  # the GPU gap from a sync to the next launch
    assert costs.extra_duration_us == {"kernel": 0.0, "copy": 0.0}


def test_replay_costs_keep_durations_and_take_the_op_figures():
    doc = profile_doc(harness_us=100.0)
    doc["harness"]["issue_by_op_us"] = {"kernel:verify": {"median": 250.0, "p10": 200.0,
                                                          "p90": 300.0, "n": 4}}
    profile = profile_from_dict(doc)
    base = Timing(d2h=17.0, schedule_kernel=11.0)
    costs = costs_from_profile(profile, base, Mode.REPLAY)
    assert costs.timing.host_launch == 100.0
    assert (costs.timing.d2h, costs.timing.schedule_kernel) == (17.0, 11.0)
    assert costs.host_issue_us["wait_stream"] == 200.0  # a record and a wait
    assert costs.extra_duration_us == {"kernel": 30.0, "copy": 10.0}
    assert costs.sync_return_us == 20.0
    assert costs.op_issue_us == {"kernel:verify": 250.0}
