"""The scenario plugin collects only where asked: the ``overlap_scenarios`` ini setting, the
``--overlap-scenarios`` option, or a file that declares itself (a ``[check]`` table with an
``expect`` verdict line). A stranger's project, with the package installed beside it, runs
its pytest untouched; its twin that opts in gets its scenarios collected."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from overlap_harness.model.config import Expect
from overlap_harness.pytest_plugin import declares_itself, is_scenario_file, matches, verdicts
from tests.cli.conftest import TWIN, write
from tests.plugin.conftest import REPO, run_pytest_in

#: The twin scenario without its ``[check]`` table (expect defaults to race_free): a
#: scenario that does not declare itself.
UNDECLARED = TWIN.replace('[check]\nexpect = "race_free"\n', "")

#: A stranger's configuration file: a ``[check]`` table, but no verdict in it.
APP_TOML = """\
[server]
port = 8080
[check]
expect = "200 OK"
interval = 5
"""

PASSING_TEST = "def test_app():\n    assert 1 + 1 == 2\n"


# --- the rule, on paths and text --------------------------------------------------------------

def test_a_pattern_covers_its_file_the_files_under_its_folder_and_its_glob() -> None:
    root = Path("/p")
    assert matches(root / "suite/a.toml", root / "suite")
    assert matches(root / "suite/deep/a.toml", root / "suite")
    assert matches(root / "suite/a.toml", root / "suite/a.toml")
    assert not matches(root / "suite_old/a.toml", root / "suite")
    assert not matches(root / "conf/app.toml", root / "suite")
    assert matches(root / "suite/a.toml", root / "suite/*.toml")
    assert matches(root / "suites/smoke_1/a.toml", root / "suites/*_1")  # a folder the glob names
    assert not matches(root / "conf/app.toml", root / "suite/*.toml")


def test_a_scenario_declares_itself_by_its_check_tables_expect_verdict() -> None:
    assert verdicts() == {e.value for e in Expect}
    assert declares_itself(TWIN)
    assert declares_itself("[check]  # the expectation\nexpect = 'race'  # a comment\n")
    assert declares_itself('[ "check" ]\n  expect="error"\n')
    # a TOML syntax error further on: still a scenario, so the loader reports its line
    assert declares_itself('[check]\nexpect = "race_free"\n[protocol\n')
    assert not declares_itself(UNDECLARED)  # expect only in [[mutation]]
    assert not declares_itself(APP_TOML)  # [check] without a verdict
    assert not declares_itself('expect = "race"\n[check]\nseed = 1\n')  # expect not in [check]
    assert not declares_itself('[check.extra]\nexpect = "race"\n')
    assert not declares_itself("")


def test_every_bundled_scenario_declares_itself() -> None:
    files = sorted((REPO / "scenarios").rglob("*.toml"))
    assert files
    assert [f.name for f in files if not declares_itself(f.read_text())] == []


def test_only_toml_files_are_read(tmp_path: Path) -> None:
    declared = write(tmp_path, "x.toml", TWIN)
    same_text = write(tmp_path, "x.txt", TWIN)
    app = write(tmp_path, "conf/app.toml", APP_TOML)
    assert is_scenario_file(declared, [])
    assert not is_scenario_file(same_text, [tmp_path])
    assert not is_scenario_file(app, [])
    assert is_scenario_file(app, [tmp_path / "conf"])  # asked for: the loader will judge it


# --- a stranger's project, with the package installed beside it ----------------------------------

@pytest.fixture
def stranger(tmp_path: Path) -> Path:
    """A project of its own: conf/app.toml and one passing test, no pytest configuration."""
    write(tmp_path, "conf/app.toml", APP_TOML)
    write(tmp_path, "tests/test_app.py", PASSING_TEST)
    return tmp_path


@pytest.mark.parametrize("args", [(), (".",), ("conf", "tests")])
def test_a_strangers_pytest_is_untouched(stranger: Path, args: tuple[str, ...]) -> None:
    got = run_pytest_in(stranger, "-q", *args)
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.splitlines()[-1].startswith("1 passed")
    assert "error" not in got.stdout.lower()


@pytest.fixture
def with_suite(stranger: Path) -> Path:
    """The stranger's project with a scenario file that does not declare itself."""
    write(stranger, "suite/twin.toml", UNDECLARED)
    return stranger


def test_a_scenario_nobody_asked_for_is_left_alone(with_suite: Path) -> None:
    got = run_pytest_in(with_suite, "-q", ".")
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.splitlines()[-1].startswith("1 passed")


def test_the_ini_setting_opts_in_and_the_runs_pass(with_suite: Path) -> None:
    write(with_suite, "pyproject.toml", textwrap.dedent("""\
        [tool.pytest.ini_options]
        overlap_scenarios = ["suite"]
        """))
    got = run_pytest_in(with_suite, "-q", "-rA", ".")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "PASSED suite/twin.toml::base" in got.stdout
    assert "PASSED suite/twin.toml::publish_ready.schedule_wait" in got.stdout
    assert "PASSED tests/test_app.py::test_app" in got.stdout
    assert got.stdout.splitlines()[-1].startswith("3 passed")


def test_the_option_with_a_glob_opts_in(with_suite: Path) -> None:
    got = run_pytest_in(with_suite, "-q", "--collect-only", "--overlap-scenarios=suite/*.toml", ".")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "suite/twin.toml::base" in got.stdout
    assert "conf/app.toml" not in got.stdout
    assert got.stdout.splitlines()[-1].startswith("3 tests collected")


def test_a_toml_file_named_on_the_command_line_is_asked_for(with_suite: Path) -> None:
    got = run_pytest_in(with_suite, "-q", "--collect-only", "suite/twin.toml", "tests")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "suite/twin.toml::base" in got.stdout
    assert got.stdout.splitlines()[-1].startswith("3 tests collected")


def test_a_file_that_declares_itself_is_collected_without_configuration(stranger: Path) -> None:
    write(stranger, "suite/twin.toml", TWIN)
    got = run_pytest_in(stranger, "-q", "--collect-only", ".")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "suite/twin.toml::publish_ready.schedule_wait" in got.stdout
    assert got.stdout.splitlines()[-1].startswith("3 tests collected")


# --- this project ------------------------------------------------------------------------------

def test_this_projects_suite_is_collected_and_its_test_data_is_not() -> None:
    """``pytest scenarios/`` (the README's) collects every bundled file; the walk of
    ``tests`` leaves the loader's test data (some of it self-declared) alone."""
    got = run_pytest_in(REPO, "-q", "--collect-only", "scenarios")
    assert got.returncode == 0, got.stdout + got.stderr
    collected = {line.split("::")[0] for line in got.stdout.splitlines() if "::" in line}
    assert collected == {str(f.relative_to(REPO)) for f in (REPO / "scenarios").rglob("*.toml")}
    got = run_pytest_in(REPO, "-q", "--collect-only", "--ignore-glob=*.py", "tests")
    assert ".toml" not in got.stdout, got.stdout
    assert "no tests collected" in got.stdout
