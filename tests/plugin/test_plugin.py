"""The pytest plugin's scenario items: failure text, -k, -x, JUnit, timing, reports, xdist,
bad files. The subprocess runs use the installed plugin (entry point ``pytest11``); which
files it collects is tests/plugin/test_opt_in.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli.conftest import TWIN, write
from tests.plugin.conftest import run_pytest_in

#: The twin with its racy mutation expecting no race: that run fails with its race report.
WRONG = TWIN.replace('name = "twin"', 'name = "wrong"').replace(
    'expect = "race"\nraces = ["RAW new_seq_lens_buf"]', 'expect = "race_free"')


# --- runs as items ---------------------------------------------------------------------------

@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """a_wrong.toml (base passes, its mutation fails) and z_twin.toml (both pass)."""
    write(tmp_path / "suite", "a_wrong.toml", WRONG)
    write(tmp_path / "suite", "z_twin.toml", TWIN)
    return tmp_path


def test_each_run_is_an_item_and_a_failure_is_its_race_report(suite: Path) -> None:
    got = run_pytest_in(suite, "suite", "--junitxml=junit.xml", "--overlap-timing",
                    "--overlap-reports=out")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "1 failed, 3 passed" in got.stdout
    assert "FAILED suite/a_wrong.toml::publish_ready.schedule_wait" in got.stdout
    report = got.stdout.split("FAIL wrong[publish_ready.schedule_wait]: expected race_free, "
                              "computed race")[1]
    assert "RAW race on new_seq_lens_buf" in report
    assert "first:  publish (iteration 0) on forward writing new_seq_lens_buf" in report
    assert "second: gather_seq_lens (iteration 1) on schedule reading new_seq_lens_buf" in report
    assert "overlap-harness run times" in got.stdout and "4 runs in all" in got.stdout
    cases = ET.parse(suite / "junit.xml").getroot().iter("testcase")
    named = {(c.get("classname"), c.get("name")): c for c in cases}
    assert set(named) == {("suite.a_wrong.toml", "base"),
                          ("suite.a_wrong.toml", "publish_ready.schedule_wait"),
                          ("suite.z_twin.toml", "base"),
                          ("suite.z_twin.toml", "publish_ready.schedule_wait")}
    props = {p.get("name"): p.get("value") for p in named[("suite.z_twin.toml", "base")]
             .iter("property")}
    assert props["verdict"] == "race_free" and float(props["wall_s"]) > 0
    assert (suite / "out" / "summary.html").is_file()


def test_k_selects_runs_and_x_stops_at_the_first_failure(suite: Path) -> None:
    got = run_pytest_in(suite, "suite", "-x", "-k", "schedule_wait")
    assert got.returncode == 1
    assert "1 failed, 2 deselected" in got.stdout  # z_twin's mutation never ran


def test_xdist_spreads_the_runs_over_two_processes(suite: Path) -> None:
    pytest.importorskip("xdist")
    got = run_pytest_in(suite, "suite/z_twin.toml", "-n", "2")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "2 workers [2 items]" in got.stdout and "2 passed" in got.stdout


def test_a_bad_file_is_a_collection_error_with_the_loaders_line(tmp_path: Path) -> None:
    write(tmp_path, "bad.toml", TWIN.replace("[protocol]", "[protocl]"))
    got = run_pytest_in(tmp_path, "bad.toml")
    assert got.returncode == 2
    assert "bad.toml: line 3: protocl: unknown table; did you mean protocol?" in got.stdout
