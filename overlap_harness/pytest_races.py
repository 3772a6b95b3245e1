"""pytest plugin: a user's own test fails when its CUDA stream work races.

Two ways in, both recording the test with :func:`recorder.watch` (CPU mode without a GPU):

* the marker ``@pytest.mark.stream_races`` (optionally ``(mode="cpu"|"gpu"|"auto")``) wraps
  the test's call; the test fails with every race's report;
* the fixture ``stream_races`` yields the running watch (``w.races`` so far); at teardown
  the test errors out if any race was found.

Registered as a ``pytest11`` entry point, so an installed overlap-harness enables it; nothing
heavy is imported until a marked test or the fixture runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

MARKER = "stream_races"


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers", f"{MARKER}(mode='auto'): fail the test when its CUDA stream work races "
        "(recorded by overlap-harness; CUDA faked on the CPU without a GPU)")


def race_report(races: list[Any], where: str) -> str:
    """The failure text: how many races, then each one's report."""
    head = f"{len(races)} stream race{'s' if len(races) != 1 else ''} in {where}"
    return "\n".join([head, *(race.describe() for race in races)])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run a marked test under a watch; fail it on a race."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    from overlap_harness.recorder import watch  # deferred: imports torch, only for marked tests

    with watch(marker.kwargs.get("mode", "auto")) as watcher:
        result = yield
    if watcher.races:
        pytest.fail(race_report(watcher.races, item.nodeid), pytrace=False)
    return result


@pytest.fixture
def stream_races(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A running :func:`recorder.watch` around the test; races fail it at teardown."""
    # deferred: imports torch, only for marked tests
    from overlap_harness.recorder import (
        watch,  # deferred: imports torch, only where the fixture is used
    )

    with watch("auto") as watcher:
        yield watcher
    if watcher.races:
        pytest.fail(race_report(watcher.races, request.node.nodeid), pytrace=False)
