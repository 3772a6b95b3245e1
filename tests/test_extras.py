"""tests/extras.py: an extra's requirements checked against the installed distributions."""

from __future__ import annotations

from importlib import metadata

from tests.extras import missing_distributions, missing_extra


def test_an_installed_distribution_within_its_specifier_is_not_missing() -> None:
    assert missing_distributions(["pytest", f"pytest=={metadata.version('pytest')}"]) == []


def test_an_absent_distribution_or_one_outside_its_specifier_is_missing() -> None:
    installed = metadata.version("pytest")
    assert missing_distributions(["overlap-harness-no-such-distribution>=1", "pytest<1"]) == [
        "overlap-harness-no-such-distribution>=1", f"pytest<1 (installed: {installed})"]


def test_the_test_extra_is_installed_where_the_tests_run() -> None:
    """The README's install holds the ``test`` extra (pytest, hypothesis, ruff, xdist)."""
    assert missing_extra("test") == []
