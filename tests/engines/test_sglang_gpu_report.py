"""The committed GPU report of SGLang's loop, checked against the loop report (no GPU needed),
and the pieces of the GPU mode that run without one: the forcing plan, the value comparison,
the report's consistency check and the ``sgl_kernel`` stand-ins."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.core.strict import UnplannedUseError, modules_installed
from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu import table as gpu_table
from overlap_harness.engines.sglang.gpu.loop import first_difference
from overlap_harness.engines.sglang.stand_ins import sgl_kernel as sgl_kernel_stub

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "reports" / "conformance" / "sglang-0.5.23-loop-gpu.json"
LOOP = ROOT / "reports" / "conformance" / "sglang-0.5.23-loop.json"


@pytest.fixture(scope="module")
def reports() -> tuple[dict, dict]:
    return json.loads(GPU.read_text()), json.loads(LOOP.read_text())


def test_every_row_carries_the_loop_reports_cpu_verdict(reports: tuple[dict, dict]) -> None:
    gpu, loop = reports
    real = {(r["variant"], r["site"]): r["real"] for r in loop["rows"]}
    sited = [r for r in gpu["rows"] if r["site"] is not None]
    assert sited
    for row in sited:
        assert real[(row["variant"], row["site"])] == row["cpu_verdict"], row
    # one unmodified row per variant the device run covered (the loop report's variants
    # added after that run have none: docs/sglang-loop.md, GPU mode, names them)
    covered = [r["variant"] for r in gpu["rows"] if r["site"] is None]
    assert len(covered) == len(set(covered)) and set(covered) <= set(loop["variants"])
    # every judged (variant, site) of a covered variant has its row, none dropped
    judged = {k for k, v in real.items() if v in ("race", "race_free") and k[0] in covered}
    assert judged == {(r["variant"], r["site"]) for r in sited}


def test_report_is_consistent_and_its_summary_recomputes(reports: tuple[dict, dict]) -> None:
    gpu, loop = reports
    assert gpu_report.problems(gpu, loop) == []
    assert gpu_report.summary(gpu["rows"]) == gpu["summary"]
    for key in ("device", "torch", "date", "command"):
        assert gpu[key]
    assert "H100" in gpu["device"] or "H200" in gpu["device"]


def test_what_the_device_run_showed(reports: tuple[dict, dict]) -> None:
    """The issue's aims, counted from the rows (independently of gpu_report.summary)."""
    gpu, _ = reports
    ok = [r for r in gpu["rows"] if not r.get("error") and r["trials"]]
    necessary_wrong = [r for r in ok if r["cpu_verdict"] == "race" and r["wrong_trials"]]
    redundant_equal = [r for r in ok if r["cpu_verdict"] == "race_free" and not r["wrong_trials"]]
    assert len(necessary_wrong) >= 10
    assert {r["variant"].split("_")[0] for r in necessary_wrong} >= {"non", "eagle"}
    assert len(redundant_equal) >= 5
    # no redundant row and no unmodified control run ever differed from the serial answer,
    # but in a variant whose tree races as released (a delay there can make that race)
    gpu_loop = reports[1]
    off = [r for r in ok if r["cpu_verdict"] in ("race_free", None) and r["wrong_trials"]]
    assert all(r.get("races_as_released") and r["variant"] in gpu_loop["released_races"]
               and r["cpu_verdict"] == "race_free" for r in off), off
    for row in necessary_wrong:
        assert "serial" in row["example_wrong"]
    # a control none of whose trials differed but one crashed is not counted bit-identical
    for verdict, key in (("race_free", "race_free_rows"), (None, "unmodified")):
        controls = [r for r in ok if r["cpu_verdict"] == verdict and not r["wrong_trials"]
                    and not r.get("not_exercised")]
        crashed = [r for r in controls
                   if any(t["error"] for t in r["trial_details"])]
        assert gpu["summary"][f"{key}_crashed"] == len(crashed)
        assert gpu["summary"][f"{key}_all_equal"] == len(controls) - len(crashed)
    # a necessary row without a wrong value is kept and says why
    for row in gpu["rows"]:
        if row["cpu_verdict"] == "race" and not row["wrong_trials"]:
            assert row["why"]


def test_each_why_follows_from_the_rows_trials_and_probes(reports: tuple[dict, dict]) -> None:
    """Recomputed here from each trial's own record (not by gpu_report): a crash of a trial
    that made the race wins, then a different acceptance record, then a different access
    value, in a made trial; else a probed trial that saw the later side run while the
    earlier side was pending says the race was made (overwritten); probed trials that never
    saw it say the delay cannot make it (timing); no probed trial: unprobed. Every row's
    slept and made counts are its trials'."""
    gpu, _ = reports
    seen = set()
    for row in gpu["rows"]:
        details = row.get("trial_details", [])
        assert row["slept_trials"] == sum(1 for t in details if t["sleeps"] > 0), row
        probed = [t["probe"] for t in details if t.get("probe")]
        made = [t for t in details if (t.get("probe") or {}).get("later_pending", 0) > 0]
        assert row["race_made_trials"] == len(made), row
        if row["cpu_verdict"] != "race" or row["wrong_trials"]:
            assert "why_reason" not in row, row
            continue
        if not row["trials"]:
            expected = "not_run"
        elif any(t["error"] for t in made):
            expected = "crashed"
        elif any(t.get("acceptance_wrong") for t in made):
            expected = "wrong_acceptance"
        elif any(t.get("access_wrong") for t in made):
            expected = "wrong_at_access"
        elif not any("earlier_issued" in p for p in probed):
            expected = "unprobed"
        elif made:
            expected = "overwritten"
        else:
            expected = "timing"
        assert row["why_reason"] == expected, row
        seen.add(expected)
    # the device runs made both kinds of finding, computed
    assert {"overwritten", "timing"} <= seen


def test_the_graph_variants_ran_on_the_device(reports: tuple[dict, dict]) -> None:
    """CUDA graph capture on the device: the graph variants' rows have trials, and a
    necessary row of each shows a wrong value."""
    gpu, _ = reports
    for variant in ("graph_decode", "graph_decode_radix", "graph_decode_post_replay"):
        rows = [r for r in gpu["rows"] if r["variant"] == variant]
        assert rows and all(r["trials"] and not r.get("error") for r in rows), variant
        assert any(r["cpu_verdict"] == "race" and r["wrong_trials"] for r in rows), variant


def test_problems_finds_a_wrong_cpu_verdict_and_a_missing_why(
        reports: tuple[dict, dict]) -> None:
    gpu, loop = reports
    broken = copy.deepcopy(gpu)
    row = next(r for r in broken["rows"] if r["cpu_verdict"] == "race_free")
    row["cpu_verdict"] = "race"
    assert any("cpu_verdict race" in p for p in gpu_report.problems(broken, loop))
    broken = copy.deepcopy(gpu)
    row = next(r for r in broken["rows"] if r["cpu_verdict"] == "race" and not r["wrong_trials"])
    del row["why"]
    assert any("says no why" in p for p in gpu_report.problems(broken, loop))
    broken = copy.deepcopy(gpu)
    broken["rows"] = [r for r in broken["rows"] if r["site"] is None or r["wrong_trials"]]
    assert any("no row here" in p for p in gpu_report.problems(broken, loop))


def test_earlier_streams_are_the_first_agent_of_each_race() -> None:
    examples = [
        "WAR t@f.py:1: model_forward on self.forward_stream at w.py:1 / copy_ on "
        "self.schedule_stream at m.py:2",
        "RAW p@f.py:2: copy_ on self.copy_stream at u.py:3 / read on host at b.py:4",
        "RAW p@f.py:2: copy_ on self.copy_stream at u.py:3 / read on host at b.py:5",
        "RAW q: write on host at a.py:1 / read on plan_stream at b.py:2",
    ]
    # a host earlier side (a host write, a free) is held on the host
    assert gpu_table.earlier_streams(examples) == ["forward_stream", "copy_stream", "host"]


def test_plan_covers_every_judged_row_and_the_unmodified_loop(reports: tuple[dict, dict]
                                                              ) -> None:
    _, loop = reports
    planned = gpu_table.plan(loop, ["non_spec_decode", "eagle_topk1"])
    assert [r["variant"] for r in planned[None]] == ["non_spec_decode", "eagle_topk1"]
    rows = [r for site, rs in planned.items() if site is not None for r in rs]
    expected = [r for r in loop["rows"] if r["variant"] in ("non_spec_decode", "eagle_topk1")
                and r["real"] in ("race", "race_free")]
    assert len(rows) == len(expected)
    assert all(r["delay"] for r in rows if r["cpu_verdict"] == "race")


def test_first_difference_names_the_value_and_the_serial_one() -> None:
    serial = {"r1.output_ids": [1, 2, 3], "req_to_token": [[0, 1], [2, 3]]}
    assert first_difference(copy.deepcopy(serial), serial) is None
    assert first_difference({"r1.output_ids": [1, 9, 3], "req_to_token": [[0, 1], [2, 3]]},
                            serial) == "r1.output_ids[1] = 9 (serial 2)"
    assert first_difference({"r1.output_ids": [1, 2, 3], "req_to_token": [[0, 1], [2, 7]]},
                            serial) == "req_to_token[1][1] = 7 (serial 3)"
    assert first_difference({"r1.output_ids": [1, 2], "req_to_token": [[0, 1], [2, 3]]},
                            serial) == "r1.output_ids: 2 values (serial 3)"


def test_sgl_kernel_stand_ins_are_strict() -> None:
    modules = {m.__name__: m for m in sgl_kernel_stub.modules()}
    with modules_installed(modules):
        import sgl_kernel
        from sgl_kernel.utils import is_arch_support_pdl

        assert getattr(sgl_kernel, sgl_kernel_stub.MARKER)
        assert is_arch_support_pdl() is False
        with pytest.raises(UnplannedUseError, match=r"sgl_kernel\.silu_and_mul"):
            sgl_kernel.silu_and_mul(None, None)
        with pytest.raises(UnplannedUseError, match="flash_attn_varlen"):
            sgl_kernel.flash_attn_varlen  # noqa: B018
        # a submodule not listed is absent: SGLang takes its own fallback
        with pytest.raises(ModuleNotFoundError):
            import sgl_kernel.scalar_type


def test_stand_ins_are_not_needed_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA host")
    assert sgl_kernel_stub.needed() is False


SIMULATED_CUDA_HOST = """
import sys, torch
torch.cuda.is_available = lambda: True
torch.version.cuda = "13.0"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "simulated"
torch.cuda.device_count = lambda: 1
from overlap_harness.engines.sglang import environment
from overlap_harness.engines.sglang.stand_ins import sgl_kernel as sgl_kernel_stub
assert sgl_kernel_stub.needed()
environment.load(None)
print("stand-in" if getattr(sys.modules["sgl_kernel"], sgl_kernel_stub.MARKER, False) else "real")
"""


@pytest.mark.slow
@pytest.mark.engine_run
def test_sglang_path_imports_with_cuda_selected_on_the_stand_ins() -> None:
    """SGLang's path modules import as on a CUDA host (torch told it has CUDA): every
    ``sgl_kernel`` name they import is a stand-in (the list was found this way)."""
    done = subprocess.run([sys.executable, "-c", SIMULATED_CUDA_HOST], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "stand-in"


def test_the_committed_report_names_no_machine_path(reports: tuple[dict, dict]) -> None:
    """Issue 45, item 6: the report's commands and texts name files relative to the repository
    or the tree (or ``<name>`` for a machine's folder), never a local absolute path."""
    import re

    text = GPU.read_text() + GPU.with_suffix(".md").read_text()
    assert not re.findall(r"(?<![\w.<])/(?:root|tmp|work|home|opt|usr)/", text)


def test_the_committed_repros_say_what_their_output_shows(reports: tuple[dict, dict]) -> None:
    """reports/device/sglang-0.5.23-gpu-repros.json (a GPU run): each repro's exit is 1 exactly
    when its output shows a wrong value or a crash, names a wrong row of the GPU report, and
    carries the device and torch it ran on."""
    gpu, _ = reports
    document = json.loads((ROOT / "reports" / "device" /
                           "sglang-0.5.23-gpu-repros.json").read_text())
    assert document["device"] and document["torch"] and document["date"]
    wrong_rows = {(r["variant"], r["site"]) for r in gpu["rows"]
                  if r["wrong_trials"] or r.get("made_crashed_trials")}
    for repro in document["repros"]:
        shown = any(line.startswith(("wrong: ", "crashed: ")) for line in repro["output"])
        assert repro["exit"] == int(shown), repro
        assert f"--repro {repro['variant']} {repro['site']}" in repro["command"]
        assert (repro["variant"], repro["site"]) in wrong_rows


def test_the_pageable_copy_measurement_is_consistent() -> None:
    """reports/device/pageable-copy-sync.json (a GPU run): ``host_waited`` is what its times
    say (the host held for most of the sleep), every direction and memory kind was measured,
    and pinned copies never held the host."""
    document = json.loads((ROOT / "reports" / "device" / "pageable-copy-sync.json").read_text())
    assert document["device"] and document["torch"] and document["sleep_seconds"] > 0
    cases = document["cases"]
    assert {(c["direction"], c["host_memory"]) for c in cases} == {
        (d, m) for d in ("H2D", "D2H") for m in ("pageable", "pinned")}
    for case in cases:
        held = case["host_seconds_in_copy"] > document["sleep_seconds"] / 2
        assert case["host_waited"] == held, case
        if case["host_memory"] == "pinned":
            assert not case["host_waited"], case
