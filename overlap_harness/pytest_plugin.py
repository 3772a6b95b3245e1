"""A pytest plugin: scenario files run as tests (``pytest scenarios/``).

Each scenario ``.toml`` becomes a test file whose items are its runs: ``base`` and one per
``[[mutation]]``, named like the command line's runs (``s02_schedule_waits_publish.toml::
publish_ready.schedule_wait``). An item passes when the computed verdict is the file's
``expect`` and every expected race was found; a failing item's text is the race report,
naming both accesses of each race. A file with bad keys fails to collect, with the loader's
one line per problem. So ``-k``, ``-x``, ``--junitxml`` and pytest-xdist (``-n 2``, and its
remote workers) work as for any test.

The plugin is installed into every pytest session of an environment that has the package,
so it collects only where asked; any other ``.toml`` is left alone. Among the files pytest
walks (the command line's paths, else ``testpaths``), a ``.toml`` file is a scenario when

- it matches the ``overlap_scenarios`` ini setting: paths or shell-style globs, relative to
  the ini file's folder; a folder covers every ``.toml`` under it;
- or it matches ``--overlap-scenarios PATH`` (the same, relative to the working folder;
  repeatable);
- or it is a ``.toml`` file named on the command line (``pytest my_scenario.toml``; a folder
  named there is only walked);
- or it declares itself: a ``[check]`` table with an ``expect = "<verdict>"`` line, the
  verdict one of ``race_free``, ``race``, ``fault``, ``error`` (the way scenario files state
  what they expect; no tool configuration has that table). A file whose ``[check]`` table
  does not say ``expect`` is a scenario only through the ways above.

Options: ``--overlap-reports DIR`` writes the command line's reports for the runs that ran
(each xdist worker into ``DIR/<worker id>``); ``--overlap-timing`` lists each run's wall and
CPU seconds in the summary (every item also carries them as ``user_properties``, so JUnit XML
has them).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from overlap_harness.model.errors import ScenarioError

#: The ini setting naming a project's scenario files (paths or globs).
INI_SETTING = "overlap_scenarios"

_RESULTS = pytest.StashKey[list]()
_PATTERNS = pytest.StashKey[list]()

#: A table header line, ``[check]`` or ``[[mutation]]`` (group 1: the table's name).
_TABLE_HEADER = re.compile(r"""\s*\[\[?\s*(["']?)([\w.-]+)\1\s*\]\]?\s*(?:#.*)?$""")
#: An ``expect = "..."`` line (group 2: the value).
_EXPECT_LINE = re.compile(r"""\s*expect\s*=\s*(["'])(\w+)\1\s*(?:#.*)?$""")
_GLOB_CHARS = frozenset("*?[")


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options and ini setting."""
    group = parser.getgroup("overlap-harness", "overlap-harness scenario files")
    group.addoption("--overlap-scenarios", metavar="PATH", action="append", default=[],
                    help="collect the .toml files at PATH (a file, a folder, or a glob) as "
                         "scenario files when pytest walks them; repeatable")
    group.addoption("--overlap-reports", metavar="DIR", default=None,
                    help="write the reports (summary.html, junit.xml, trace.json, ...) of the "
                         "scenario runs to DIR (each xdist worker to DIR/<worker id>)")
    group.addoption("--overlap-timing", action="store_true",
                    help="list each scenario run's wall and CPU seconds in the summary")
    parser.addini(INI_SETTING, type="paths", default=[],
                  help="scenario files: paths or globs (a folder covers the .toml files "
                       "under it); other .toml files are collected only when they declare "
                       "themselves with a [check] table's expect line")


def pytest_configure(config: pytest.Config) -> None:
    """A per-session list of results (for reports); the scenario patterns; the timing
    summary when asked."""
    config.stash[_RESULTS] = []
    here = config.invocation_params.dir
    named = [here / arg.split("::")[0] for arg in config.args
             if config.args_source == pytest.Config.ArgsSource.ARGS]
    config.stash[_PATTERNS] = [
        _real(Path(p)) for p in [*config.getini(INI_SETTING),
                                 *(here / p for p in config.getoption("--overlap-scenarios")),
                                 *(p for p in named if p.suffix == ".toml")]]
    if config.getoption("--overlap-timing"):
        config.pluginmanager.register(_Timing(), "overlap-harness-timing")


def _real(path: Path) -> Path:
    """``path`` absolute, with symbolic links resolved as far as it exists (globs kept)."""
    return Path(os.path.realpath(path))


def matches(file: Path, pattern: Path) -> bool:
    """Whether ``file`` is covered by ``pattern`` (both absolute): the file itself, a folder
    above it, or a glob matching it or a folder above it (``*`` also crosses folders)."""
    if _GLOB_CHARS.isdisjoint(str(pattern)):
        return file == pattern or file.is_relative_to(pattern)
    return any(fnmatch.fnmatchcase(str(p), str(pattern)) for p in (file, *file.parents))


@functools.cache
def verdicts() -> frozenset[str]:
    """The values a scenario's ``check.expect`` takes (imported on the first ``.toml``)."""
    from overlap_harness.model.config import Expect  # deferred: keeps other projects' start-up lean

    return frozenset(e.value for e in Expect)


def declares_itself(text: str) -> bool:
    """Whether a file's ``text`` has a ``[check]`` table with an ``expect = "<verdict>"``
    line: the mark of a scenario file (see the module doc). A line scan, not a parse, so a
    scenario file with a TOML syntax error is still collected, and fails with its line."""
    table = ""
    for line in text.splitlines():
        header = _TABLE_HEADER.match(line)
        if header:
            table = header[2]
        elif table == "check":
            expect = _EXPECT_LINE.match(line)
            if expect and expect[2] in verdicts():
                return True
    return False


def is_scenario_file(file: Path, patterns: Iterable[Path]) -> bool:
    """Whether the walked ``file`` is to be collected as a scenario: a ``.toml`` that a
    pattern covers, or that declares itself. Other files are not read."""
    if file.suffix != ".toml":
        return False
    real = _real(file)
    if any(matches(real, pattern) for pattern in patterns):
        return True
    try:
        text = real.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return declares_itself(text)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    """Collect a scenario file that was asked for."""
    if is_scenario_file(file_path, parent.config.stash[_PATTERNS]):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    """A scenario file: its runs are the items."""

    def collect(self) -> Iterator[ScenarioRun]:
        """Load the file (bad input: a collection error with one line per problem) and
        yield one item per run."""
        # deferred: imports torch, only once a scenario file is collected
        from overlap_harness.scenarios.expand import (
            expand,  # deferred: light, but keeps plugin start-up lean
        )
        from overlap_harness.scenarios.loader import load_scenario

        scenario = load_scenario(_shown(self.path, self.config), runnable=True)
        for spec in expand(scenario):
            yield ScenarioRun.from_parent(self, name=spec.mutation_name or "base", spec=spec)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        """A bad file: the loader's lines (file: key: reason), no traceback."""
        if isinstance(excinfo.value, ScenarioError):
            return "\n".join(excinfo.value.problems)
        return str(super().repr_failure(excinfo))


class RunFailed(Exception):
    """A run's verdict differs from what its file expects; carries the run's result."""

    def __init__(self, result: Any) -> None:
        super().__init__(result.name)
        self.result = result


class ScenarioRun(pytest.Item):
    """One run of a scenario (base or a mutation) on the simulated device."""

    def __init__(self, *, spec: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def runtest(self) -> None:
        """Simulate the run and its oracle; fail unless the verdict is the expected one."""
        # deferred: the runner imports torch and the simulator, needed only to run scenarios
        from overlap_harness.runner import run_spec

        wall, cpu = time.perf_counter(), time.process_time()
        result = run_spec(self.spec)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.user_properties += [("run_id", self.spec.run_id), ("verdict", result.verdict),
                                 ("wall_s", f"{wall:.3f}"), ("cpu_s", f"{cpu:.3f}")]
        self.config.stash[_RESULTS].append(result)
        if not result.ok:
            raise RunFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        """A failed run: the race report (both accesses of each race), not a traceback."""
        if isinstance(excinfo.value, RunFailed):
            from overlap_harness.runner import failure_report  # deferred: see runtest

            return failure_report(excinfo.value.result)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the run comes from: the scenario file, and the run's id."""
        return self.path, None, self.spec.run_id


def _shown(path: Path, config: pytest.Config) -> str:
    """The path as messages print it: relative to the invocation folder when inside it."""
    try:
        return str(path.relative_to(config.invocation_params.dir))
    except ValueError:
        return str(path)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the reports of the runs this process ran, when ``--overlap-reports`` asks."""
    out = session.config.getoption("--overlap-reports")
    results = session.config.stash[_RESULTS]
    if not out or not results:
        return
    # deferred: imports torch, only once a scenario file is collected
    from overlap_harness.reports.writer import (
        write_all,  # deferred: matplotlib, only when reports are asked
    )

    worker = getattr(session.config, "workerinput", {}).get("workerid")
    write_all(results, Path(out) / worker if worker else Path(out))


class _Timing:
    """Collects each scenario run's seconds from the reports (xdist workers' included) and,
    with ``--overlap-timing``, lists them in the summary, slowest first."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float, float]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Remember the seconds a scenario run's call phase reported."""
        props = dict(report.user_properties)
        if report.when == "call" and "wall_s" in props:
            self.times.append((report.nodeid, float(props["wall_s"]), float(props["cpu_s"])))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """The timing section."""
        if not self.times:
            return
        terminalreporter.section("overlap-harness run times")
        for nodeid, wall, cpu in sorted(self.times, key=lambda t: -t[1]):
            terminalreporter.write_line(f"{wall:8.2f}s wall {cpu:8.2f}s cpu  {nodeid}")
        total_wall = sum(t[1] for t in self.times)
        total_cpu = sum(t[2] for t in self.times)
        terminalreporter.write_line(f"{total_wall:8.2f}s wall {total_cpu:8.2f}s cpu  "
                                    f"{len(self.times)} runs in all")
