"""CI's guard on the release matrices: where ``OVERLAP_HARNESS_REQUIRE_RELEASE_CI=1`` (the
README's CI command sets it), a test marked ``release_ci`` that skips fails instead, with the
skip's reason. CI runs those tests to check releases (SGLang's and vLLM's newest); a wheel that
cannot be fetched, or an extra missing from CI's venv, would otherwise turn that check into a
skip that nobody reads. Anywhere else (a developer without the wheel or the extra) such a test
skips with its reason, as any other. Registered by tests/conftest.py; a plugin of its own
(``-p tests.release_ci_guard``) so that its test can load it alone."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

#: the variable CI sets: "1" turns a skipped ``release_ci`` test into a failure
REQUIRE_RELEASE_CI = "OVERLAP_HARNESS_REQUIRE_RELEASE_CI"


def release_ci_required() -> bool:
    """Whether this run must run every ``release_ci`` test it selects (CI)."""
    return os.environ.get(REQUIRE_RELEASE_CI) == "1"


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """A ``release_ci`` test's skip (in its setup or its body) becomes a failure where
    :func:`release_ci_required`; an expected failure (xfail) is left as it is."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if (report.skipped and not hasattr(report, "wasxfail") and release_ci_required()
            and item.get_closest_marker("release_ci") is not None):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is a release_ci test and skipped where "
                           f"{REQUIRE_RELEASE_CI}=1 requires it to run: {_skip_reason(report)}")
