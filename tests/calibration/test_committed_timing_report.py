"""The committed timing-replay reports (``reports/gpu/calibration/*-timing-vs-*.json``, written
by ``overlap-harness calibrate --timing-compare``) state numbers consistent with their rows,
and their rows with the measurement they name (the replays' metrics, medians recomputed here
with the standard library, not with the code that wrote them).

Skips, with the reason, while none is committed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from overlap_harness.model.profile import load_profile
from overlap_harness.profile_check import METRICS

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "reports" / "gpu" / "calibration"
REPORTS = sorted(p for p in FOLDER.glob("*-timing-vs-*.json")
                 if json.loads(p.read_text(encoding="utf-8")).get("kind") == "timing-check")

pytestmark = pytest.mark.skipif(not REPORTS, reason="no timing-replay report is committed "
                                "under reports/gpu/calibration/ yet (calibrate --timing-suite)")


@pytest.fixture(params=REPORTS, ids=[p.name for p in REPORTS])
def doc(request):
    return request.param, json.loads(request.param.read_text(encoding="utf-8"))


def _errors(rows, metric, limit=None):
    out = []
    for r in rows:
        m = r["metrics"][metric]
        if m["measured"] == 0 or (limit is not None and (m["spread"] is None
                                                           or m["spread"] > limit)):
            continue
        out.append(abs((m["predicted"] - m["measured"]) / m["measured"]))
    return out


def test_rows_are_the_measurements_medians(doc):
    path, d = doc
    measurement = json.loads((path.parent / d["measurement"]).read_text(encoding="utf-8"))
    runs = {r["run_id"]: r for r in measurement["runs"]}
    assert [r["run_id"] for r in d["rows"]] == [r["run_id"] for r in measurement["runs"]]
    assert d["repeats"] == measurement["repeats"]
    for row in d["rows"]:
        repeats = runs[row["run_id"]]["repeats"]
        assert len(repeats) == measurement["repeats"]
        for k in METRICS:
            values = [x[k] for x in repeats]
            mid = statistics.median(values)
            m = row["metrics"][k]
            assert m["measured"] == round(mid)
            if mid:
                assert m["spread"] == round(max(abs(v / mid - 1) for v in values), 4)
                assert m["rel_err"] == (m["predicted"] - m["measured"]) / m["measured"]
            else:
                assert m["spread"] is None


def test_summary_numbers_are_their_rows(doc):
    _, d = doc
    for k in METRICS:
        errs = _errors(d["rows"], k)
        s = d["summary"][k]
        assert s["runs"] == len(errs)
        assert s["median_abs_rel_err"] == round(statistics.median(errs), 4)
        assert s["max_abs_rel_err"] == round(max(errs), 4)
        assert s["within_10pct"] == sum(e <= 0.10 for e in errs)
        steady = _errors(d["rows"], k, d["steady"]["limit"])
        assert d["steady"][k]["runs"] == len(steady)
        assert d["steady"][k]["max_abs_rel_err"] == round(max(steady), 4)
        spreads = [r["metrics"][k]["spread"] for r in d["rows"]
                   if r["metrics"][k]["spread"] is not None]
        assert d["noise_floor"][k]["max"] == round(max(spreads), 4)
    met = all(d["summary"][k]["median_abs_rel_err"] <= 0.10
              and d["summary"][k]["max_abs_rel_err"] <= 0.25 for k in METRICS)
    assert d["summary"]["targets_met"] == met


def test_page_states_the_summary_and_every_row(doc):
    path, d = doc
    page = path.with_suffix(".md").read_text(encoding="utf-8")
    for k in METRICS:
        s = d["summary"][k]
        assert (f"{k.removesuffix('_ns')} median {100 * s['median_abs_rel_err']:.1f}% worst "
                f"{100 * s['max_abs_rel_err']:.1f}%") in page
    for r in d["rows"]:
        assert f"| {r['run_id']} | {r['kind']} |" in page
    assert path.with_name(d["plot"]).is_file()


def test_order_and_host_speed_are_stated(doc):
    path, d = doc
    measurement = json.loads((path.parent / d["measurement"]).read_text(encoding="utf-8"))
    assert d["order"] == measurement["order"]
    assert f"{d['repeats']} replays a run, from prebuilt op lists; {d['order']})" in \
        path.with_suffix(".md").read_text(encoding="utf-8")
    for run in measurement["runs"]:  # one kernel call time per replay, in µs
        assert len(run["kernel_call_us"]) == measurement["repeats"]
        assert all(0 < k < 1000 for k in run["kernel_call_us"])


def test_profile_and_device_named_are_committed(doc):
    path, d = doc
    profile = load_profile(ROOT / "profiles" / d["profile"])
    assert profile.device == d["profile_device"]
    assert profile.timing is not None
    measurement = json.loads((path.parent / d["measurement"]).read_text(encoding="utf-8"))
    assert measurement["device"] == d["measured_device"]
