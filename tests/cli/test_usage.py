"""Usage the command line refuses before any work, in one line: numbers out of range, check's
own options after the script, a folder given to check as its script."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from overlap_harness import check_cmd, cli
from overlap_harness.cli import main
from overlap_harness.cli_options import count, seconds


def _numeric_options() -> list[tuple[str, str, argparse.Action]]:
    """(command, option, action) for every option taking a number (metavar N or S)."""
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [(name, action.option_strings[-1], action) for name, p in sub.choices.items()
            for action in p._actions if action.metavar in ("N", "S")]


NUMERIC = _numeric_options()


def test_every_numeric_option_checks_its_range_as_it_is_parsed() -> None:
    assert len(NUMERIC) >= 12
    for name, option, action in NUMERIC:
        assert action.type is seconds or getattr(action.type, "__qualname__", "") == \
            count(1).__qualname__, f"{name} {option}: give it type=count(...) or seconds"


def _refused_values(action: argparse.Action) -> list[str]:
    if action.type is seconds:
        return ["0", "-1", "nan", "inf", "soon"]
    least = next(k for k in range(-1, 10) if _accepts(action, str(k)))
    return [str(least - 1), "1.5", "many"]


def _accepts(action: argparse.Action, text: str) -> bool:
    try:
        action.type(text)
    except argparse.ArgumentTypeError:
        return False
    return True


@pytest.mark.parametrize(("name", "option", "action"), NUMERIC,
                         ids=[f"{n} {o}" for n, o, _ in NUMERIC])
def test_a_number_out_of_range_is_one_line_and_exit_2(
        name: str, option: str, action: argparse.Action,
        capsys: pytest.CaptureFixture[str]) -> None:
    positional = {"plot": ["s.toml"], "whatif": ["s.toml"], "check": ["s.py"]}.get(name, ["x"])
    for value in _refused_values(action):
        assert main([name, f"{option}={value}", *positional]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"overlap-harness {name}: error: argument ")
        assert f"{option}: expected a " in err
        assert err.endswith(f" (see overlap-harness {name} --help)\n")


def test_explore_time_limit_names_the_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explore", "x.toml", "--time-limit", "-1"]) == 2
    assert capsys.readouterr().err == (
        "overlap-harness explore: error: argument --time-limit: expected a number of seconds "
        "above 0, got -1 (see overlap-harness explore --help)\n")
    assert main(["explore", "x.toml", "--time-limit", "0.5", "--explore", "0"]) == 2
    assert capsys.readouterr().err == (
        "overlap-harness explore: error: argument --explore: expected a whole number of at "
        "least 1, got 0 (see overlap-harness explore --help)\n")


def test_a_number_in_range_is_taken() -> None:
    assert count(1)("3") == 3
    assert seconds("0.25") == 0.25


# --- check: its options before the script ---------------------------------------------------

@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "prog.py"
    path.write_text("print('ran')\n")
    return path


@pytest.mark.parametrize("given", ["--json", "--json=out.json", "--out", "--gpu", "--cpu"])
def test_checks_own_option_after_the_script_is_refused_with_a_hint(
        given: str, script: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from overlap_harness.recorder import api

    monkeypatch.setattr(api, "check_script", _never_checked)
    option = given.split("=")[0]
    value = " ..." if option in ("--json", "--out") else ""
    assert main(["check", str(script), "--my-flag", given, "x"]) == 2
    assert capsys.readouterr().err == (
        f"overlap-harness check: {option} after the script would go to {script}, not to "
        f"check: put it before the script (overlap-harness check {option}{value} {script}), "
        f"or write {script} -- {option}{value} if the script takes it\n")


def _never_checked(*_args, **_kwargs):
    raise AssertionError("the script ran although check's usage was wrong")


def test_the_scripts_own_options_pass_through_and_after_a_dash_dash_all_do(
        script: Path, tmp_path: Path) -> None:
    assert check_cmd.split_command([str(script), "--my-flag", "-v", "3"]) == (
        str(script), ["--my-flag", "-v", "3"])
    assert check_cmd.split_command([str(script), "--fast", "--", "--json", "x", "--"]) == (
        str(script), ["--fast", "--json", "x", "--"])
    assert check_cmd.split_command(["--", str(script), "--x"]) == (str(script), ["--x"])
    with pytest.raises(check_cmd.CheckUsageError):  # a -- before the script ends check's own
        check_cmd.split_command(["--", str(script), "--out"])


def test_options_before_the_script_are_checks_and_the_rest_the_scripts(
        script: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script.write_text("import sys\nprint('argv', sys.argv[1:])\n")
    out = tmp_path / "races.json"
    assert main(["check", "--cpu", "--json", str(out), str(script), "--", "--json", "v"]) == 0
    assert "argv ['--json', 'v']" in capsys.readouterr().out
    assert out.is_file()


def test_a_folder_given_as_the_script_says_so(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--cpu", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"overlap-harness check: {tmp_path}: is a directory, "
                                       "not a script; give the Python file to run\n")


def test_no_script_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--cpu"]) == 2
    assert capsys.readouterr().err == (
        "overlap-harness check: give the Python script to run: overlap-harness check "
        "[--json FILE] [--out DIR] [--gpu|--cpu] SCRIPT [ARGS]\n")
