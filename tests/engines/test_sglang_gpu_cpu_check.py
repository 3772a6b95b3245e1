"""``--gpu-check-cpu``: a GPU row whose race the device could not make (``timing``) held
against the CPU mode. The classes of each ordering call (gpu/cpu_check.py) on hand-made
inputs, one CPU run of SGLang's loop whose recorded ops are looked up, and the committed
GPU report's timing rows each carrying the check."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from overlap_harness.engines.sglang.gpu import cpu_check
from overlap_harness.engines.sglang.gpu import report as gpu_report

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "reports" / "conformance" / "sglang-0.5.23-loop-gpu.json"
SGLANG_COPY = "sglang/srt/model_executor/forward_batch_info.py:1236"


def _row(*orderings: dict[str, int]) -> dict:
    return {"trial_details": [{"probe": {"orderings": o}} for o in orderings]}


def test_the_ordering_calls_are_the_union_of_the_trials_with_the_largest_count() -> None:
    row = _row({"to at a/x.py:3": 2, "tolist at b/y.py:4": 5}, {"to at a/x.py:3": 7}, {})
    assert cpu_check.ordering_calls(row) == {"to at a/x.py:3": 7, "tolist at b/y.py:4": 5}


def test_each_call_is_classed_by_where_it_is_and_what_the_cpu_mode_recorded() -> None:
    calls = {f"to at {SGLANG_COPY}": 3,
             "tolist at overlap_harness/engines/sglang/stand_ins/eagle_models.py:44": 3,
             "wait at torch/cuda/streams.py:63": 3,
             "copy_ at overlap_harness/engines/sglang/gpu/access_values.py:69": 3,
             "record_stream at sglang/srt/managers/overlap_utils.py:497": 3,
             "tolist at sglang/srt/mem_cache/allocation.py:483": 3,
             "synchronize at sglang/srt/managers/overlap_utils.py:639": 3}
    recorded = {SGLANG_COPY: ["copy on forward_stream"]}
    found = cpu_check.classify(calls, recorded)
    classes = {entry["call"].split(" at ")[1]: entry["class"] for entry in found["calls"]}
    assert classes == {SGLANG_COPY: "recorded",
                       "overlap_harness/engines/sglang/stand_ins/eagle_models.py:44": "stand_in",
                       "torch/cuda/streams.py:63": "inside_library",
                       "overlap_harness/engines/sglang/gpu/access_values.py:69": "instrument",
                       "sglang/srt/managers/overlap_utils.py:497": "allocator",
                       "sglang/srt/mem_cache/allocation.py:483": "no_device_op",
                       "sglang/srt/managers/overlap_utils.py:639": "missed"}
    assert found["cpu_misses"] is True
    assert "overlap_utils.py:639" in found["finding"]
    # the same with the synchronize recorded: nothing missed, the stand-in named
    recorded["sglang/srt/managers/overlap_utils.py:639"] = ["host_sync on host"]
    found = cpu_check.classify(calls, recorded)
    assert found["cpu_misses"] is False
    assert "eagle_models.py:44" in found["finding"] and "stands" in found["finding"]
    assert cpu_check.classify({}, recorded)["cpu_misses"] is False


def test_recorded_ops_are_keyed_from_the_sglang_package_on() -> None:
    timeline = [SimpleNamespace(source="/any/where/python/sglang/srt/a.py:9", kind="copy",
                                agent="self.forward_stream"),
                SimpleNamespace(source="/any/where/python/sglang/srt/a.py:9", kind="copy",
                                agent="self.forward_stream"),
                SimpleNamespace(source="sglang/srt/a.py:9", kind="wait", agent="plan_stream"),
                SimpleNamespace(source="", kind="kernel", agent="host")]
    assert cpu_check.recorded_at(timeline) == {
        "sglang/srt/a.py:9": ["copy on self.forward_stream", "wait on plan_stream"]}


CHILD = """
import json
from overlap_harness.engines.sglang.gpu import cpu_check
row = json.loads(sys.argv[1])
print("RESULT " + json.dumps(cpu_check.check_site((row["variant"], row["site"], [row]))))
"""


@pytest.mark.engine_run
def test_a_cpu_run_without_the_site_finds_sglangs_own_copy_recorded() -> None:
    """eagle_d2h_stream without the D2H stream's wait (overlap_utils.py:636): the H2D copy
    the device met between the sides (forward_batch_info.py:1236) is one the CPU mode
    records; the stand-in's host read is named as the harness's."""
    from tests.engines.sglang_trees import run_child

    row = {"variant": "eagle_d2h_stream", "site": "sglang/srt/managers/overlap_utils.py:636",
           **_row({f"to at {SGLANG_COPY}": 30,
                   "tolist at overlap_harness/engines/sglang/stand_ins/eagle_models.py:44": 30})}
    (found,) = run_child(CHILD, row)
    assert isinstance(found, dict), found
    classes = {entry["class"] for entry in found["calls"]}
    assert classes == {"recorded", "stand_in"}
    (copy,) = [e for e in found["calls"] if e["class"] == "recorded"]
    assert "copy on" in copy["what"]
    assert found["cpu_misses"] is False


def test_every_timing_row_of_the_committed_report_is_checked() -> None:
    report = json.loads(GPU.read_text())
    timing = cpu_check.timing_rows(report)
    assert timing, "the committed report has timing rows"
    for row in timing:
        checked = row["cpu_verdict_checked"]
        assert checked["finding"]
        calls = cpu_check.ordering_calls(row)
        if not isinstance(checked.get("cpu_misses"), bool):  # a CPU run that failed says so
            assert checked["finding"].startswith("the CPU run could not be made"), row
            continue
        assert {e["call"] for e in checked["calls"]} == set(calls)
        assert checked["cpu_misses"] == any(e["class"] == "missed" for e in checked["calls"])
    summary = gpu_report.summary(report["rows"])
    assert summary["timing_rows_cpu_checked"] == len(timing)


def test_a_timing_row_without_the_check_is_a_problem() -> None:
    report = json.loads(GPU.read_text())
    row = cpu_check.timing_rows(report)[0]
    del row["cpu_verdict_checked"]
    loop = json.loads((GPU.parent / "sglang-0.5.23-loop.json").read_text())
    assert any("without cpu_verdict_checked" in p for p in gpu_report.problems(report, loop))
