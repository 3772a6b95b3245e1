"""The pytest plugin (issue 19, item 1): scenario files as test items, failure text, -k, -x,
JUnit, timing, reports, xdist; and that it collects nothing the project's own run did not ask
for. The subprocess runs use the installed plugin (entry point ``pytest11``)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from overlap_harness.pytest_plugin import asked_for
from tests.cli.conftest import TWIN, write

REPO = Path(__file__).resolve().parents[2]

#: The twin with its racy mutation expecting no race: that run fails with its race report.
WRONG = TWIN.replace('name = "twin"', 'name = "wrong"').replace(
    'expect = "race"\nraces = ["RAW new_seq_lens_buf"]', 'expect = "race_free"')


def pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest in ``folder`` (no cache, no ini of this project) and capture its output.

    The plugin comes in through its entry point where the package is installed, and is
    named with ``-p`` where it is not (a bare checkout, as on the GPU machine)."""
    installed = any(ep.value == "overlap_harness.pytest_plugin"
                    for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "overlap_harness.pytest_plugin"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin,
                           *args], cwd=folder, capture_output=True, text=True, timeout=300,
                          check=False, env=env)


# --- which files are collected ---------------------------------------------------------------

def test_named_files_and_folders_are_collected_but_not_test_data_or_tool_config() -> None:
    repo = Path("/repo")
    tests = [repo / "tests"]
    data = repo / "tests/data/scenarios/good.toml"
    suite = repo / "scenarios/protocol/s01.toml"
    assert asked_for(suite, [repo / "scenarios"], tests, [])
    assert asked_for(suite, [suite], tests, [])
    assert not asked_for(suite, [], tests, [])  # the testpaths default names nothing
    assert not asked_for(data, [repo / "tests"], tests, [])  # `pytest tests`
    assert not asked_for(data, [repo], tests, [])  # `pytest .`
    assert asked_for(data, [repo / "tests/data/scenarios"], tests, [])  # asked for by name
    assert asked_for(data, [data], tests, [])
    assert not asked_for(repo / "pyproject.toml", [repo], tests, [])
    assert not asked_for(repo / "scenarios/loader.py", [repo / "scenarios"], tests, [])
    assert asked_for(suite, [], tests, [repo / "scenarios"])  # the overlap_scenarios ini


# --- runs as items ---------------------------------------------------------------------------

@pytest.fixture
def suite(tmp_path: Path) -> Path:
    """a_wrong.toml (base passes, its mutation fails) and z_twin.toml (both pass)."""
    write(tmp_path / "suite", "a_wrong.toml", WRONG)
    write(tmp_path / "suite", "z_twin.toml", TWIN)
    return tmp_path


def test_each_run_is_an_item_and_a_failure_is_its_race_report(suite: Path) -> None:
    got = pytest_in(suite, "suite", "--junitxml=junit.xml", "--overlap-timing",
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
    got = pytest_in(suite, "suite", "-x", "-k", "schedule_wait")
    assert got.returncode == 1
    assert "1 failed, 2 deselected" in got.stdout  # z_twin's mutation never ran


def test_xdist_spreads_the_runs_over_two_processes(suite: Path) -> None:
    pytest.importorskip("xdist")
    got = pytest_in(suite, "suite/z_twin.toml", "-n", "2")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "2 workers [2 items]" in got.stdout and "2 passed" in got.stdout


def test_a_bad_file_is_a_collection_error_with_the_loaders_line(tmp_path: Path) -> None:
    write(tmp_path, "bad.toml", TWIN.replace("[protocol]", "[protocl]"))
    got = pytest_in(tmp_path, "bad.toml")
    assert got.returncode == 2
    assert "bad.toml: line 3: protocl: unknown table; did you mean protocol?" in got.stdout
