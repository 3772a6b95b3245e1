"""The committed GPU run of the random programs (reports/recorder/mode-fuzz/): where, when and
how it ran, and figures that agree with each other and with its command line.

The GPU side cannot be recomputed here; the CPU side can: the programs it names are drawn
again from their seeds and run in CPU mode, which must still give each a verdict (no crash)."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from pathlib import Path

from tests.recorder.random_programs import random_program, run_steps

REPORTS = Path(__file__).resolve().parents[2] / "reports" / "recorder" / "mode-fuzz"


def newest() -> dict:
    paths = sorted(REPORTS.glob("*.json"))
    assert paths, f"no report in {REPORTS}"
    return json.loads(paths[-1].read_text())


def test_the_report_says_where_when_and_how_it_ran():
    summary = newest()["summary"]
    assert summary["device"] and summary["torch"]
    assert dt.datetime.fromisoformat(summary["date"].replace("Z", "+00:00")).year >= 2026
    words = shlex.split(summary["command"])
    assert words[:2] == ["python3", "tools/recorder_mode_fuzz.py"]
    options = dict(zip(words[2::2], words[3::2], strict=False))
    assert int(options["--programs"]) == summary["programs"]
    assert int(options["--length"]) == summary["length"]


def test_the_count_of_differences_is_the_list_of_them():
    report = newest()
    assert report["summary"]["differences"] == len(report["differences"])
    assert report["summary"]["programs"] >= 100
    for difference in report["differences"]:
        assert difference["cpu"] != difference["gpu"] and difference["steps"]


def test_the_programs_it_ran_still_run_in_cpu_mode():
    summary = newest()["summary"]
    first = summary["first_seed"]
    for seed in range(first, first + summary["programs"], max(1, summary["programs"] // 12)):
        assert isinstance(run_steps(random_program(seed, summary["length"]), "cpu"), list)
