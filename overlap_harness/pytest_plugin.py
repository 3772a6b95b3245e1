"""A pytest plugin: scenario files run as tests (``pytest scenarios/``).

Each scenario ``.toml`` becomes a test file whose items are its runs: ``base`` and one per
``[[mutation]]``, named like the command line's runs (``s02_schedule_waits_publish.toml::
publish_ready.schedule_wait``). An item passes when the computed verdict is the file's
``expect`` and every expected race was found; a failing item's text is the race report,
naming both accesses of each race. A file with bad keys fails to collect, with the loader's
one line per problem. So ``-k``, ``-x``, ``--junitxml`` and pytest-xdist (``-n 2``, and its
remote workers) work as for any test.

Which ``.toml`` files are collected (the project's own ``pytest`` must not change):

- a file named on the command line, or a file under a folder named on the command line,
  except under a ``testpaths`` folder that the named folder contains (``pytest tests`` and
  ``pytest .`` leave the loader's deliberately bad test data alone) and except tool
  configuration files (``pyproject.toml`` and the like);
- a file under a folder listed in the ``overlap_scenarios`` ini setting, always.

Nothing is collected when pytest runs on its ``testpaths`` default. Options:
``--overlap-reports DIR`` writes the command line's reports for the runs that ran (each
xdist worker into ``DIR/<worker id>``); ``--overlap-timing`` lists each run's wall and CPU
seconds in the summary (every item also carries them as ``user_properties``, so JUnit XML
has them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from overlap_harness.model.errors import ScenarioError

#: The ini setting naming folders whose scenario files are always collected.
INI_FOLDERS = "overlap_scenarios"

#: ``.toml`` names that configure tools and are never scenarios.
NOT_SCENARIOS = frozenset({"pyproject.toml", "ruff.toml", ".ruff.toml", "Cargo.toml",
                           "uv.toml", "pixi.toml"})

_RESULTS = pytest.StashKey[list]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options and ini setting."""
    group = parser.getgroup("overlap-harness", "overlap-harness scenario files")
    group.addoption("--overlap-reports", metavar="DIR", default=None,
                    help="write the reports (summary.html, junit.xml, trace.json, ...) of the "
                         "scenario runs to DIR (each xdist worker to DIR/<worker id>)")
    group.addoption("--overlap-timing", action="store_true",
                    help="list each scenario run's wall and CPU seconds in the summary")
    parser.addini(INI_FOLDERS, type="paths", default=[],
                  help="folders whose scenario .toml files are collected even when they are "
                       "not named on the command line")


def pytest_configure(config: pytest.Config) -> None:
    """A per-session list of results (for reports); the timing summary when asked."""
    config.stash[_RESULTS] = []
    if config.getoption("--overlap-timing"):
        config.pluginmanager.register(_Timing(), "overlap-harness-timing")


def asked_for(file: Path, named: list[Path], test_folders: list[Path],
              ini_folders: list[Path]) -> bool:
    """Whether the scenario-looking ``file`` is to be collected (see the module doc).

    ``named`` are the command line's paths, ``test_folders`` the ``testpaths`` folders,
    ``ini_folders`` those of the ``overlap_scenarios`` setting, all absolute."""
    if file.suffix != ".toml" or file.name in NOT_SCENARIOS:
        return False
    if any(file.is_relative_to(folder) for folder in ini_folders):
        return True
    for root in named:
        if file == root:
            return True
        if not file.is_relative_to(root):
            continue
        shielded = any(file.is_relative_to(test) and test.is_relative_to(root)
                       for test in test_folders)
        if not shielded:
            return True
    return False


def _named_paths(config: pytest.Config) -> list[Path]:
    """The paths given on the command line (none when pytest fell back to ``testpaths``)."""
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        return []
    here = config.invocation_params.dir
    return [(here / arg.split("::")[0]).resolve() for arg in config.args]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    """Collect a scenario file that was asked for."""
    config = parent.config
    root = config.rootpath
    test_folders = [(root / p).resolve() for p in config.getini("testpaths")]
    ini_folders = [Path(p).resolve() for p in config.getini(INI_FOLDERS)]
    if asked_for(file_path.resolve(), _named_paths(config), test_folders, ini_folders):
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
