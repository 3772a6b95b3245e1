"""``calibrate`` on the CPU: usage errors are one line and exit 2; --profile helpers."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest
import torch

from overlap_harness.calibrate_cmd import add_profile_argument, apply_profile, main
from overlap_harness.model.config import Scenario, Timing
from tests.calibration.synthetic import profile_doc


@pytest.mark.parametrize(("argv", "line"), [
    ([], "overlap-harness: calibrate: give --out FILE (measure, on a GPU) or --compare "
         "REPORT.json --profile FILE (CPU), not both or neither (or --timing-compare "
         "MEASUREMENT.json --profile FILE)"),
    (["--out", "a.json", "--compare", "r.json"],
     "overlap-harness: calibrate: give --out FILE (measure, on a GPU) or --compare "
     "REPORT.json --profile FILE (CPU), not both or neither (or --timing-compare "
         "MEASUREMENT.json --profile FILE)"),
    (["--compare", "r.json"], "overlap-harness: calibrate --compare needs --profile FILE"),
    (["--timing-compare", "m.json"],
     "overlap-harness: calibrate --timing-compare needs --profile FILE"),
    (["--refit-timing", "r.json.gz"],
     "overlap-harness: calibrate --refit-timing needs --profile FILE and --out FILE"),
])
def test_usage_errors(argv, line, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_measuring_without_a_gpu_is_one_line(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err == ("overlap-harness: calibrate needs a CUDA device to "
                                       "measure; torch.cuda.is_available() is False\n")


def test_bad_profile_in_compare_is_one_line(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text("[]")
    assert main(["--compare", "r.json", "--profile", str(bad)]) == 2
    assert capsys.readouterr().err == f"overlap-harness: {bad}: expected a JSON object at " \
                                      "the top\n"


def test_profile_argument_and_apply(tmp_path):
    parser = argparse.ArgumentParser()
    add_profile_argument(parser)
    assert parser.parse_args([]).profile is None
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_doc(system_us=3.0)))
    assert parser.parse_args(["--profile", str(path)]).profile == str(path)
    sc = Scenario(timing=Timing(host_launch=5.0, forward=1234.0))
    assert apply_profile(sc, None) is sc
    got = apply_profile(sc, path)
    assert got.timing.host_launch == 3.0
    assert got.timing.forward == 1234.0


class _FakeReplayDevice:
    """Stands in for SentinelCudaDevice: a SimDevice with a 150 µs launch cost."""

    def __new__(cls, removed, calibration=None):
        from overlap_harness.sim.sim_device import SimDevice

        return SimDevice(removed, host_launch_us=150.0)


def test_measure_harness_and_refit_round_trip(monkeypatch, tmp_path, capsys):
    import overlap_harness.replay.sentinel as gpu_device
    from overlap_harness.calibrate_cmd import (
        measure_harness,
        read_timelines,
        with_harness,
        write_timelines,
    )
    from overlap_harness.model.profile import dump_profile, profile_from_dict

    monkeypatch.setattr(gpu_device, "SentinelCudaDevice", _FakeReplayDevice)
    pairs, run_ids = measure_harness(["profiles/calibration/cal_non_spec.toml"], None, runs=2)
    assert run_ids == [run_ids[0]] * 2 and run_ids[0].startswith("cal_non_spec/base-")
    saved = tmp_path / "t.json.gz"
    write_timelines(pairs, saved, run_ids)
    def unsourced(ps):  # the source line is not saved: the fit does not use it
        return [tuple([dataclasses.replace(r, source="") for r in tl] for tl in p) for p in ps]

    assert read_timelines(saved) == unsourced(pairs)
    fitted = with_harness(profile_from_dict(profile_doc()), pairs, "fitted")
    assert fitted.harness_issue_us["kernel"].median == 150.0
    assert fitted.notes[-1] == "fitted"
    base = tmp_path / "base.json"
    dump_profile(profile_from_dict(profile_doc()), base)
    out = tmp_path / "refit.json"
    assert main(["--refit", str(saved), "--profile", str(base), "--out", str(out)]) == 0
    from overlap_harness.model.profile import load_profile
    assert load_profile(out).harness_issue_us["copy"].median == 150.0
    assert capsys.readouterr().err == f"wrote {out}\n"
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"nope")
    assert main(["--refit", str(bad), "--profile", str(base), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"overlap-harness: {bad}: not a calibration timelines "
                                       "file: Not a gzipped file (b'no')\n")
