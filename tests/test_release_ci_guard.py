"""tests/release_ci_guard.py: where CI sets OVERLAP_HARNESS_REQUIRE_RELEASE_CI=1, a skipped
``release_ci`` test fails (so a wheel that cannot be fetched or an extra missing from CI's venv
cannot hide); elsewhere it skips. Each case is a pytest run of its own, in a child process,
over a small test file, with the guard loaded alone (``-p tests.release_ci_guard``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from tests.release_ci_guard import REQUIRE_RELEASE_CI

ROOT = Path(__file__).resolve().parent.parent

TESTS = '''
import pytest

@pytest.mark.release_ci
def test_release_skipping():
    pytest.skip("vllm==0.34.0: cannot download (no registry)")

@pytest.fixture
def wheel():
    pytest.skip("the vllm extra is not installed: cachetools")

@pytest.mark.release_ci
def test_release_skipping_in_setup(wheel):
    pass

@pytest.mark.release_ci
def test_release_running():
    assert True

def test_other_skipping():
    pytest.skip("no GPU")

@pytest.mark.release_ci
@pytest.mark.xfail(reason="a known gap", strict=True)
def test_release_expected_to_fail():
    assert False
'''


def _pytest(tmp_path: Path, required: str | None, *options: str) -> tuple[int, dict, str]:
    """Run the sample tests; the status, each test's outcome (from JUnit XML) and the output."""
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    release_ci: CI runs it\n")
    env = {key: value for key, value in os.environ.items() if key != REQUIRE_RELEASE_CI}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the installed plugins import torch: slow
    if required is not None:
        env[REQUIRE_RELEASE_CI] = required
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.release_ci_guard",
                           "-p", "no:cacheprovider", "--junitxml", str(junit), *options,
                           "test_sample.py"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
                          check=False)
    output = done.stdout + done.stderr
    return done.returncode, _outcomes(junit), output


def _outcomes(junit: Path) -> dict[str, str]:
    """Each test's outcome: its JUnit element (failure, error, skipped) or passed; an xfail
    is a ``skipped`` of type ``pytest.xfail``."""
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        verdict = "passed"
        for child in case:
            if child.tag in {"failure", "error"}:
                verdict = child.tag
            elif child.tag == "skipped":
                verdict = "xfail" if child.get("type") == "pytest.xfail" else "skipped"
        outcomes[case.get("name")] = verdict
    return outcomes


#: the probe project's outcomes where CI requires the release tests: their skips fail
REQUIRED_OUTCOMES = {"test_release_skipping": "failure",
                     "test_release_skipping_in_setup": "error",
                     "test_release_running": "passed",
                     "test_other_skipping": "skipped",
                     "test_release_expected_to_fail": "xfail"}


def test_where_ci_requires_the_release_tests_their_skips_fail(tmp_path: Path) -> None:
    status, outcomes, output = _pytest(tmp_path, "1")
    assert status == 1, output
    assert outcomes == REQUIRED_OUTCOMES, output
    assert (f"is a release_ci test and skipped where {REQUIRE_RELEASE_CI}=1 requires it to "
            "run: vllm==0.34.0: cannot download (no registry)") in output
    assert "the vllm extra is not installed: cachetools" in output


@pytest.mark.parametrize("required", [None, "0"])
def test_elsewhere_a_release_test_skips_as_any_other(tmp_path: Path,
                                                     required: str | None) -> None:
    status, outcomes, output = _pytest(tmp_path, required)
    assert status == 0, output
    assert outcomes == {"test_release_skipping": "skipped",
                        "test_release_skipping_in_setup": "skipped",
                        "test_release_running": "passed",
                        "test_other_skipping": "skipped",
                        "test_release_expected_to_fail": "xfail"}, output


def test_the_guard_holds_in_xdist_workers_as_ci_runs_them(tmp_path: Path) -> None:
    """CI's pytest runs in two workers (``-n 2``): the reports are made there."""
    status, outcomes, output = _pytest(tmp_path, "1", "-p", "xdist", "-n", "2")
    assert status == 1, output
    assert outcomes == REQUIRED_OUTCOMES, output
