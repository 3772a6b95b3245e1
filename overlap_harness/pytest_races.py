"""pytest plugin: a user's own test fails when its CUDA stream work races.

Two ways in, sharing one recording per test (:func:`recorder.watch`, CPU mode without a GPU):

* the marker ``@pytest.mark.stream_races(mode="auto", expect=[...])`` records the test's call
  and judges it there: the test fails with the report of every race not in ``expect`` and
  names every expected race that did not occur. ``mode`` is ``"cpu"``, ``"gpu"`` or
  ``"auto"``; ``"gpu"`` without a CUDA device skips the test with the reason. ``expect``
  lists races as ``"KIND tensor"``: ``KIND`` one of ``RAW``, ``WAR``, ``WAW``, ``host-D2H``,
  ``reuse``, and ``tensor`` the variable the report names (``data`` in
  ``RAW race on data@test_x.py:7``), or that whole name to pin one allocation. A test whose
  own assert fails keeps its failure and gets a ``stream races`` section with the races.
* the fixture ``stream_races`` yields the running watch (``w.races`` so far) from its setup
  on; at teardown the test errors out if any race was found. With the marker too, the
  fixture's watch is the marker's (its mode), it ends with the test's call, and the marker's
  judgement is the one reported.

Registered as a ``pytest11`` entry point, so an installed overlap-harness enables it; nothing
heavy is imported until a marked test or the fixture runs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

MARKER = "stream_races"

_MARKER_ARGS = ("mode", "expect")


class MarkerError(Exception):
    """The marker's arguments are wrong; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class MarkerSettings:
    """What ``@pytest.mark.stream_races(...)`` asks for."""

    mode: str = "auto"
    expect: tuple[str, ...] = ()


@dataclass(slots=True)
class SharedWatch:
    """The one watch of a test, shared by the marker and the fixture.

    Started by whichever comes first (the fixture at setup, else the marker at the call),
    stopped once; ``judged`` is set when the marker has reported on it."""

    settings: MarkerSettings
    watcher: Any = None
    running: bool = False
    judged: bool = False

    def start(self) -> Any:
        """Enter the watch (once) and return it."""
        if self.watcher is None:
            from overlap_harness.recorder import watch  # deferred: imports torch

            self.watcher = watch(self.settings.mode)
            self.watcher.__enter__()
            self.running = True
        return self.watcher

    def stop(self) -> None:
        """Leave the watch (once); its races stay readable."""
        if self.running:
            self.running = False
            self.watcher.__exit__(None, None, None)


@dataclass(frozen=True, slots=True)
class Judgement:
    """Races held against ``expect``: those not expected, and the expected ones not found."""

    unexpected: list[Any] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every race expected and every expected race found."""
        return not self.unexpected and not self.missing


_SETTINGS = pytest.StashKey[MarkerSettings]()
_RECORDING = pytest.StashKey[SharedWatch]()
_SECTION = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker."""
    config.addinivalue_line(
        "markers", f"{MARKER}(mode='auto', expect=()): fail the test when its CUDA stream "
        "work races, unless the race is expected as 'KIND tensor', e.g. expect=['RAW buf'] "
        "(recorded by overlap-harness; CUDA faked on the CPU without a GPU)")


def marker_settings(args: Sequence[Any], kwargs: dict[str, Any]) -> MarkerSettings:
    """The marker's arguments checked: keyword ``mode`` and ``expect`` only.

    Raises:
        MarkerError: positional or unknown arguments, or an ``expect`` entry that is not
            ``"KIND tensor"``.
    """
    if args:
        raise MarkerError(f"{MARKER}: takes keyword arguments only (mode=..., expect=[...]), "
                          f"got {args[0]!r}")
    unknown = sorted(set(kwargs) - set(_MARKER_ARGS))
    if unknown:
        raise MarkerError(f"{MARKER}: unknown argument {unknown[0]!r}; expected "
                          f"{' or '.join(_MARKER_ARGS)}")
    expect = kwargs.get("expect", ())
    if isinstance(expect, str) or not isinstance(expect, Iterable):
        raise MarkerError(f"{MARKER}: expect: a list of \"KIND tensor\" strings, e.g. "
                          f"expect=[\"RAW buf\"], got {expect!r}")
    mode = kwargs.get("mode", "auto")
    from overlap_harness.recorder.api import MODES  # deferred: imports torch, marked tests only

    if mode not in MODES:
        raise MarkerError(f"{MARKER}: mode: expected one of {'|'.join(MODES)}, got {mode!r}")
    return MarkerSettings(mode=mode,
                          expect=tuple(_expected_race(entry) for entry in expect))


def _expected_race(entry: Any) -> str:
    """One ``expect`` entry, whitespace normalised: ``"RAW buf"``."""
    from overlap_harness.model.trace import RaceKind  # deferred: only for marked tests

    kinds = [str(kind) for kind in RaceKind]
    words = entry.split() if isinstance(entry, str) else []
    if len(words) != 2 or words[0] not in kinds:
        raise MarkerError(f"{MARKER}: expect: {entry!r} is not \"KIND tensor\" with KIND one "
                          f"of {'|'.join(kinds)}, e.g. \"RAW buf\"")
    return " ".join(words)


def expected_by(race: Any, expected: str) -> bool:
    """Whether ``race`` is the ``"KIND tensor"`` of ``expected``: the same kind, and the
    tensor's variable (the report's name before ``@``) or its whole name."""
    kind, tensor = expected.split(" ")
    name = str(race.buffer)
    return str(race.kind) == kind and tensor in (name, name.partition("@")[0])


def judge(races: Sequence[Any], expect: Sequence[str]) -> Judgement:
    """The races against ``expect`` (one entry covers every race of its kind and tensor)."""
    return Judgement(
        unexpected=[r for r in races if not any(expected_by(r, e) for e in expect)],
        missing=[e for e in expect if not any(expected_by(r, e) for r in races)])


def race_report(races: Sequence[Any], where: str, missing: Sequence[str] = ()) -> str:
    """The failure text: how many races, each one's report, then expected races not found."""
    lines = []
    if races:
        lines.append(f"{len(races)} stream race{'s' if len(races) != 1 else ''} in {where}")
        lines += [race.describe() for race in races]
    if missing:
        lines.append(f"expected stream race{'s' if len(missing) != 1 else ''} not found in "
                     f"{where}: {', '.join(missing)}")
    return "\n".join(lines)


def _recording(item: pytest.Item) -> SharedWatch:
    """The test's shared recording (made on first use, with the marker's settings)."""
    if _RECORDING not in item.stash:
        item.stash[_RECORDING] = SharedWatch(item.stash.get(_SETTINGS, MarkerSettings()))
    return item.stash[_RECORDING]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``mode="gpu"`` is skipped, with the reason, where torch sees no CUDA
    device (torch is imported only when such a test is collected)."""
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and marker.kwargs.get("mode") == "gpu":
            reason = _no_gpu_reason()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@functools.cache
def _no_gpu_reason() -> str:
    """Why GPU mode cannot run here ("" where it can)."""
    from overlap_harness.recorder.api import RecorderError, resolve_mode  # deferred: torch

    try:
        resolve_mode("gpu")
    except RecorderError as exc:
        return f"{MARKER}: {exc}"
    return ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Check a marked test's arguments before its fixtures; bad ones fail it with one line."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return
    problem = ""
    try:
        settings = marker_settings(marker.args, marker.kwargs)
    except MarkerError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(problem, pytrace=False)
    item.stash[_SETTINGS] = settings


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run a marked test under the test's watch and judge its races; a test that fails on
    its own keeps its failure, with the races added to its report."""
    settings = item.stash.get(_SETTINGS, None)
    if settings is None:
        return (yield)
    recording = _recording(item)
    recording.start()
    try:
        result = yield
    except BaseException:
        text = _judge_call(item, recording)
        if text:
            item.stash[_SECTION] = text
        raise
    text = _judge_call(item, recording)  # outside the except: no "during handling" chain
    if text:
        pytest.fail(text, pytrace=False)
    return result


def _judge_call(item: pytest.Item, recording: SharedWatch) -> str:
    """Stop the watch and judge it against the marker: the failure text, or "" when ok."""
    recording.stop()
    recording.judged = True
    verdict = judge(recording.watcher.races, recording.settings.expect)
    return "" if verdict.ok else race_report(verdict.unexpected, item.nodeid, verdict.missing)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Add the races to the report of a marked test that failed on its own."""
    report = yield
    text = item.stash.get(_SECTION, None)
    if text and call.when == "call" and report.failed:
        if hasattr(report.longrepr, "addsection"):
            report.longrepr.addsection("stream races", text)
        else:
            report.sections.append(("stream races", text))
    return report


@pytest.fixture
def stream_races(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The test's running :func:`recorder.watch`; races fail it at teardown (with the
    marker, the marker judges them at the end of the call instead)."""
    recording = _recording(request.node)
    yield recording.start()
    if recording.judged:
        return
    recording.stop()
    verdict = judge(recording.watcher.races, recording.settings.expect)
    if not verdict.ok:
        pytest.fail(race_report(verdict.unexpected, request.node.nodeid, verdict.missing),
                    pytrace=False)
