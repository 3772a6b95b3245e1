"""The command line: exit codes, pipe-able JSON, --version, checks before anything runs,
no silent passes, progress and the memory estimate (issue 19, items 2, 4, 5 and 6)."""

from __future__ import annotations

import dataclasses
import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlap_harness import cli, runner
from overlap_harness.cli import main
from overlap_harness.runner import estimate_run_bytes, explore_specs, run_spec, unused_removals
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario
from overlap_harness.whatif import whatif
from tests.cli.conftest import TWIN, write

RUN = ["run", "--no-reports", "-q"]


def never_run(*_args, **_kwargs):
    """Stands in for the simulation where a test asserts nothing ran."""
    raise AssertionError("the simulation ran although the input was bad")


# --- item 2: --version and --json - -----------------------------------------------------------

def test_version_names_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"overlap-harness {cli.__version__}"
    assert cli.__version__[0].isdigit()


def test_json_to_stdout_is_the_json_alone(twin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, str(twin), "--json", "-"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # the whole of stdout: no table, no "2 passed" line
    assert doc["summary"]["cases"] == 2 and doc["summary"]["failed"] == 0
    assert "2 passed, 0 failed" in err and "publish_ready.schedule_wait" in err


def test_without_json_dash_the_table_stays_on_stdout(
        twin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, str(twin)]) == 0
    out, _ = capsys.readouterr()
    assert "2 passed, 0 failed" in out


# --- item 4: exit codes -------------------------------------------------------------------------

def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for line in ("0    every verdict as expected", "1    a verdict differs",
                 "2    bad input or usage", "3    internal error", "130  interrupted"):
        assert line in out


def test_a_verdict_that_differs_exits_1(tmp_path: Path) -> None:
    wrong = write(tmp_path, "w.toml", TWIN.replace('expect = "race_free"', 'expect = "race"'))
    assert main([*RUN, str(wrong)]) == cli.EXIT_MISMATCH == 1


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 2
    assert "the following arguments are required: paths" in capsys.readouterr().err


def test_internal_error_exits_3_with_the_traceback(
        twin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def crash(*_args, **_kwargs):
        raise ZeroDivisionError("our bug")

    monkeypatch.setattr(runner, "run_scenarios", crash)
    assert main([*RUN, str(twin)]) == cli.EXIT_INTERNAL == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError: our bug" in err
    assert err.rstrip().endswith("please report it with the traceback above")


def test_a_crash_in_whatif_exits_3(twin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_args, **_kwargs):
        raise KeyError("variant")

    monkeypatch.setattr("overlap_harness.whatif.simulate", crash)
    assert main(["whatif", str(twin), "-q"]) == 3


def test_ctrl_c_exits_130_with_one_line(
        twin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_scenarios", interrupted)
    assert main([*RUN, str(twin)]) == cli.EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == "overlap-harness: interrupted"


def test_ctrl_c_during_the_runs_writes_those_that_finished_marked_partial(
        twin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The twin has two runs: Ctrl-C in the second leaves the first, written with
    ``partial: true``, and exit 130."""
    execute, calls = runner.execute, []

    def second_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return execute(*args, **kwargs)

    monkeypatch.setattr(runner, "execute", second_interrupted)
    out = tmp_path / "partial.json"
    assert main([*RUN, "-j", "1", str(twin), "--json", str(out)]) == 130
    document = json.loads(out.read_text())
    assert document["partial"] is True and document["summary"]["cases"] == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "overlap-harness: interrupted after 1 runs; --json written with partial: true")


# --- item 4: checked before anything runs ---------------------------------------------------

@pytest.mark.parametrize(("flags", "line"), [
    (["--out", "{file}"], "overlap-harness: --out {file}: is a file, not a folder"),
    (["--out", "{file}/sub"],
     "overlap-harness: --out {file}/sub: {file} is not a folder, so {file}/sub cannot be made"),
    (["--no-reports", "--junit", "{dir}"],
     "overlap-harness: --junit {dir}: is a folder; give a file name"),
    (["--no-reports", "--json", "{file}/x.json"],
     "overlap-harness: --json folder {file}: is a file, not a folder"),
])
def test_unusable_output_paths_stop_before_the_simulation(
        twin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], flags: list[str], line: str) -> None:
    monkeypatch.setattr(runner, "run_scenarios", never_run)
    file = tmp_path / "a_file"
    file.write_text("")
    names = {"file": str(file), "dir": str(tmp_path)}
    argv = ["run", "-q", str(twin), *(f.format(**names) for f in flags)]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == line.format(**names)


# --- item 5: no silent passes --------------------------------------------------------------------

UNUSED = """
name = "plan_off"
[protocol]
plan_stream = false
[workload]
iterations = 2
requests = [{ id = "A", prompt_len = 4, max_new = 4 }]
[[mutation]]
remove = ["plan.forward_wait"]
expect = "race_free"
"""


def test_removing_a_sync_never_reached_is_an_error_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "u.toml", UNUSED)
    assert main([*RUN, str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f'{path}: mutation[0].remove[0]: sync label "plan.forward_wait" is never reached in '
        "this configuration, so removing it changes nothing; remove it from the list or set "
        "allow_unused = true in mutation[0]")


def test_allow_unused_accepts_the_removal(tmp_path: Path) -> None:
    path = write(tmp_path, "u.toml", UNUSED.replace(
        'expect = "race_free"\n', 'expect = "race_free"\nallow_unused = true\n'))
    assert main([*RUN, str(path)]) == 0


def test_only_the_removals_not_reached_are_reported(twin: Path) -> None:
    spec = expand(load_scenario(twin))[1]
    assert unused_removals(spec, ["publish_ready.schedule_wait", "war_barrier"]) == []
    assert [line.split(": ")[1] for line in unused_removals(spec, ["war_barrier"])] == [
        "mutation[0].remove[0]"]
    assert unused_removals(expand(load_scenario(twin))[0], []) == []  # the base removes none


# --- item 6: progress and the memory estimate --------------------------------------------------

class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_shows_iterations_rate_and_time_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    monkeypatch.setenv("COLUMNS", "160")
    progress = cli._Progress(True)
    progress(0, 2, "twin/base")
    progress.started -= 10.0  # 10 s into the run: 250 of 1000 iterations, 5000 ops
    progress.drawn = 0.0  # the line was not redrawn in the last quarter second
    progress.watch(250, 1000, 5000)
    line = screen.getvalue().split("\r")[-1].strip()
    assert line.endswith("250/1000 it  500 ops/s  ETA 30s")
    assert "0/2 twin/base" in line


def test_progress_off_a_terminal_stays_quiet_inside_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    progress = cli._Progress(True)
    progress(0, 2, "twin/base")
    progress.watch(250, 1000, 5000)
    assert log.getvalue() == "[0/2] twin/base\n"


def test_a_run_reports_every_iteration_of_the_run_and_its_oracle(twin: Path) -> None:
    seen: list[tuple[int, int]] = []
    ops: list[int] = []

    def watch(done: int, total: int, op_count: int) -> None:
        seen.append((done, total))
        ops.append(op_count)

    run_spec(expand(load_scenario(twin))[0], watch=watch)
    assert [done for done, _ in seen] == [0, 1, 2, 3, 3, 4, 5, 6]  # 3 iterations + drain, twice
    assert {total for _, total in seen} == {6}
    assert ops[:4] == sorted(ops[:4]) and ops[3] > ops[0]  # ops issued so far, one device
    assert ops[4] < ops[3]  # the oracle's device counts from its own start


def test_whatif_and_explore_report_progress(twin: Path) -> None:
    scenario = load_scenario(twin)
    variants: list[str] = []
    iterations: list[int] = []
    whatif(scenario, {"ref": {}, "no_barrier": {"war_barrier": "none"}},
           progress=lambda i, n, name: variants.append(f"{i}/{n} {name}"),
           watch=lambda done, total, ops: iterations.append(done))
    assert variants == ["0/2 ref", "1/2 no_barrier", "2/2 "]
    assert iterations == [0, 1, 2, 3, 0, 1, 2, 3]
    trials: list[tuple[int, int]] = []
    explore_specs([scenario], budget=4, watch=lambda tried, budget: trials.append((tried,
                                                                                   budget)))
    assert trials[0] == (1, 4) and all(budget == 4 for _, budget in trials)


def test_memory_estimate_grows_with_the_request_pool_and_iterations(twin: Path) -> None:
    small = load_scenario(twin)
    wide = dataclasses.replace(small, protocol=dataclasses.replace(
        small.protocol, max_context=65_536))
    long = dataclasses.replace(wide, workload=dataclasses.replace(
        wide.workload, iterations=1000))
    assert estimate_run_bytes(small) < 40 * 2**20  # a small scenario: tens of MiB
    # pool_size 16 x 65,536 columns at 1,100 B, plus 70 B per column and iteration:
    assert estimate_run_bytes(wide) == (runner.BYTES_FIXED + 3 * runner.BYTES_PER_ITERATION
                                        + 1100 * 16 * 65_536 + 70 * 3 * 65_536)
    assert estimate_run_bytes(long) > 5 * 2**30


def test_a_scenario_that_would_not_fit_is_refused_with_the_estimate_and_the_override(
        twin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "available_memory_bytes", lambda: 2**20)
    monkeypatch.setattr(runner, "run_scenarios", never_run)
    assert main([*RUN, str(twin)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"overlap-harness: {twin}: estimated peak memory 0.0")
    assert "exceeds the 0.0 GiB available" in err
    assert err.endswith("pass --ignore-memory-estimate to run it anyway")


def test_the_override_runs_it_with_a_warning(
        twin: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "available_memory_bytes", lambda: 2**20)
    assert main([*RUN, str(twin), "--ignore-memory-estimate"]) == 0
    assert "warning:" in capsys.readouterr().err


# --- the real process: python -m, and Ctrl-C in a long run ---------------------------------------

LONG = TWIN.replace("iterations = 3", "iterations = 10000").replace("max_new = 8",
                                                                    "max_new = 100")


def test_python_m_gives_the_version() -> None:
    got = subprocess.run([sys.executable, "-m", "overlap_harness", "--version"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert (got.returncode, got.stdout.strip()) == (0, f"overlap-harness {cli.__version__}")


def test_ctrl_c_in_a_long_run_exits_130_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "long.toml", LONG)
    process = subprocess.Popen(  # SIGINT as a terminal sends it, even if our parent ignores it
        [sys.executable, "-m", "overlap_harness", "run", "--no-reports", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stderr is not None
    first = process.stderr.readline()  # the progress line: the run has started
    assert first.startswith("[0/2] twin/base")
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err.rstrip().endswith("overlap-harness: interrupted after 0 runs")
    assert "Traceback" not in err and out == ""
