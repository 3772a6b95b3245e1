"""``overlap-harness check``: exit status, argv and environment passed through, --json, --out,
a crashing script's own traceback; and the pytest marker that fails a user's racy test."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from overlap_harness.cli import main

PROGRAM = textwrap.dedent("""\
    import os
    import sys
    import torch

    side = torch.cuda.Stream()
    staged = torch.arange(6, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        staged.mul_(2)
    if "--fixed" in sys.argv:
        torch.cuda.current_stream().wait_stream(side)
    total = staged.sum()
    print("env", os.environ.get("CHECK_TEST_VALUE"), "result", total.item())
    """)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    return path


def test_racy_script_exits_1_and_json_names_both_sites(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CHECK_TEST_VALUE", "passed-through")
    out = tmp_path / "races.json"
    assert main(["check", "--cpu", "--json", str(out), str(script)]) == 1
    printed = capsys.readouterr().out
    assert "env passed-through result 30" in printed  # issue order: the serial values
    (race,) = json.loads(out.read_text())["races"]
    assert (race["kind"], race["tensor"], race["allocated_at"].endswith("prog.py:6")) == (
        "RAW", "staged@prog.py:6", True)
    assert (race["elements"], race["element_count"], race["count"]) == ([[0, 6]], 6, 1)
    sides = [(Path(a["file"]).name, a["line"], a["op"], a["stream"], a["mode"])
             for a in (race["first"], race["second"])]
    assert sides == [("prog.py", 9, "mul_", "side", "write"), ("prog.py", 12, "sum", "default",
                                                                 "read")]


def test_fixed_script_exits_0_with_its_arguments(script, capsys):
    assert main(["check", "--cpu", str(script), "--fixed"]) == 0
    assert "0 races" in capsys.readouterr().out


def test_crashing_script_exits_2_with_its_own_traceback(tmp_path, capsys):
    path = tmp_path / "crash.py"
    path.write_text("import torch\n\ndef f():\n    raise ValueError('boom in the script')\n\nf()\n")
    assert main(["check", "--cpu", str(path)]) == 2
    err = capsys.readouterr().err
    assert "ValueError: boom in the script" in err
    assert f'File "{path}", line 4, in f' in err
    assert "recorder" + os.sep not in err and "runpy" not in err


def test_a_crashed_script_claims_no_race_count(tmp_path, capsys):
    """A script that races, then crashes: its race is printed, but the verdict line says the
    run has no verdict instead of a race count (the rest of the script never ran)."""
    path = tmp_path / "races_then_crashes.py"
    path.write_text(PROGRAM + "raise RuntimeError('after the race')\n")
    assert main(["check", "--cpu", str(path)]) == 2
    out, err = capsys.readouterr()
    [verdict] = [line for line in out.splitlines() if line.startswith(f"{path}: ")]
    assert verdict.startswith(f"{path}: no verdict, the script crashed (cpu mode, ")
    assert verdict.endswith("; the races above happened before the crash)")
    assert "RAW race on staged" in out and not re.search(r"\d+ races?\b", verdict)
    assert err.rstrip().endswith(f"overlap-harness check: {path} crashed")


def test_ctrl_c_keeps_the_races_seen_and_writes_them_marked_partial(tmp_path):
    """A real SIGINT to ``overlap-harness check`` (a child) while its script sleeps after
    racing: exit 130 at once, the race printed, the JSON written with ``partial: true`` and no
    race-free or racy verdict claimed."""
    path = tmp_path / "races_then_sleeps.py"
    path.write_text(PROGRAM + "print('raced', flush=True)\nimport time\ntime.sleep(300)\n")
    out = tmp_path / "races.json"
    child = subprocess.Popen(
        [sys.executable, "-m", "overlap_harness", "check", "--cpu", "--json", str(out),
         str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert child.stdout.readline().startswith("env ")  # the script's own print
        assert child.stdout.readline() == "raced\n"
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert time.monotonic() - sent < 15 and child.returncode == 130, stderr
    assert "RAW race on staged" in stdout
    assert stdout.rstrip().splitlines()[-1].startswith(f"{path}: no verdict, interrupted")
    assert stderr.rstrip().splitlines()[-1] == "overlap-harness check: interrupted"
    document = json.loads(out.read_text())
    assert (document["partial"], document["verdict"], len(document["races"])) == (
        True, "interrupted", 1)


def test_script_exit_status_is_a_crash(tmp_path, capsys):
    path = tmp_path / "exits.py"
    path.write_text("import sys\nsys.exit(3)\n")
    assert main(["check", "--cpu", str(path)]) == 2
    assert "exited with status 3" in capsys.readouterr().err


def test_missing_script_is_bad_input_in_one_line(tmp_path, capsys):
    assert main(["check", "--cpu", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert err == f"overlap-harness check: {tmp_path / 'nope.py'}: no such script\n"


def test_out_writes_plot_perfetto_and_sarif_at_the_users_lines(script, tmp_path):
    out = tmp_path / "reports"
    assert main(["check", "--cpu", "--out", str(out), str(script)]) == 1
    assert (out / "plots" / "prog.py.png").is_file() and (out / "plots" / "prog.py.svg").is_file()
    trace = json.loads((out / "trace.json").read_text())
    assert {e.get("args", {}).get("name") for e in trace["traceEvents"]} >= {"side", "default"}
    (result,) = json.loads((out / "results.sarif").read_text())["runs"][0]["results"]
    (primary,) = result["locations"]  # the later access's line, the earlier one related
    (related,) = result["relatedLocations"]
    assert (result["ruleId"], primary["physicalLocation"]["region"]["startLine"],
            related["physicalLocation"]["region"]["startLine"]) == ("RAW", 12, 9)
    assert primary["physicalLocation"]["artifactLocation"]["uri"].endswith("prog.py")
    assert result["message"]["text"].startswith("RAW race on staged (allocated at ")


MARKED_TEST = textwrap.dedent("""\
    import pytest
    import torch

    def program(fixed):
        side = torch.cuda.Stream()
        data = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            data.fill_(1)
        if fixed:
            torch.cuda.current_stream().wait_stream(side)
        data.sum()

    @pytest.mark.stream_races(mode="cpu")
    def test_racy():
        program(False)

    @pytest.mark.stream_races(mode="cpu")
    def test_fixed():
        program(True)

    def test_fixture_racy(stream_races):
        program(False)
    """)


def test_pytest_marker_and_fixture_fail_a_racy_user_test(tmp_path):
    """The plugin comes in through its pytest11 entry point (pyproject.toml) where the
    package is installed; named with ``-p`` where it is not (a bare checkout)."""
    (tmp_path / "test_user.py").write_text(MARKED_TEST)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    installed = any(ep.value == "overlap_harness.pytest_races"
                    for ep in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "overlap_harness.pytest_races"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, "test_user.py"],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    out = proc.stdout
    assert "FAILED test_user.py::test_racy" in out
    assert "ERROR test_user.py::test_fixture_racy" in out
    assert "1 stream race in test_user.py::test_racy" in out
    assert "1 failed, 2 passed, 1 error" in out  # test_fixed passes; the fixture errs at teardown
