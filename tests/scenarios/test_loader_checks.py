"""Problems the loader finds before parsing or running (issue 19, items 4 and 5): a byte-order
mark, nesting too deep for the TOML reader, symbolic link loops, a folder named as a file,
and a scenario with nothing to run. Exact lines, as the other loader tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from overlap_harness.cli import main
from overlap_harness.model.errors import ScenarioError
from overlap_harness.scenarios.loader import MAX_NESTING, _too_deep, load_paths, load_scenario

RUNNABLE = '[workload]\nrequests = [{ id = "A" }]\n'


def problems_of(path: Path | str, runnable: bool = False) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load_paths([path], runnable=runnable)
    return [re.sub(r"^(.+?\.toml): line \d+: (?=[^:]+: )", r"\1: ", p)  # test_locate.py
            for p in info.value.problems]


def test_a_byte_order_mark_is_named_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + RUNNABLE.encode())
    assert problems_of(path) == [
        f"{path}: line 1: starts with a UTF-8 byte-order mark (BOM), which TOML does not "
        "allow; save the file as UTF-8 without BOM"]
    path.write_bytes(RUNNABLE.encode())  # the twin without the mark loads
    assert load_scenario(path).workload.requests[0].id == "A"


def test_deep_nesting_is_refused_with_its_line_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text('name = "deep"\n\nx = ' + "[" * 5000 + "]" * 5000 + "\n")
    assert problems_of(path) == [f"{path}: line 3: arrays or tables nested more than "
                                 f"{MAX_NESTING} deep; a scenario needs at most 3"]


def test_the_nesting_scan_skips_strings_and_comments() -> None:
    brackets = "[" * (MAX_NESTING + 1)
    assert _too_deep(f'a = "{brackets}"\n# {brackets}\nb = \'{brackets}\'\n', MAX_NESTING) is None
    assert _too_deep(f'a = """\n{brackets}\n"""\nb = {brackets}', MAX_NESTING) == 4
    assert _too_deep("[[mutation]]\n" * 100, MAX_NESTING) is None  # headers close on their line


def test_a_symbolic_link_loop_is_not_called_missing(tmp_path: Path) -> None:
    loop = tmp_path / "loop.toml"
    os.symlink(loop, loop)
    dangling = tmp_path / "gone.toml"
    os.symlink(tmp_path / "nowhere.toml", dangling)
    assert problems_of(loop) == [f"{loop}: symbolic link loop (the link leads back to itself); "
                                 "point it at a file"]
    assert problems_of(dangling) == [f"{dangling}: symbolic link to {tmp_path}/nowhere.toml, "
                                     "which does not exist"]
    assert problems_of(tmp_path / "none.toml") == [f"{tmp_path}/none.toml: no such file or "
                                                   "folder"]


def test_a_link_loop_inside_a_folder_is_reported_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "ok.toml").write_text(RUNNABLE)
    os.symlink(tmp_path / "loop.toml", tmp_path / "loop.toml")
    assert problems_of(tmp_path) == [f"{tmp_path}/loop.toml: symbolic link loop (the link "
                                     "leads back to itself); point it at a file"]


def test_a_folder_named_like_a_scenario_file(tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "dir.toml")
    assert info.value.problems == [f"{tmp_path}/dir.toml: is a folder, not a scenario file"]


NOTHING = "workload.requests: none, so the scenario has nothing to run; add " \
          "[[workload.requests]] with an id, prompt_len and max_new"


@pytest.mark.parametrize("text", ["", 'name = "x"\n', "[workload]\niterations = 3\n",
                                  "[workload]\nrequests = []\n"])
def test_a_scenario_with_nothing_to_run_is_an_error_when_it_is_to_run(
        tmp_path: Path, text: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(text)
    assert problems_of(path, runnable=True) == [f"{path}: {NOTHING}"]
    load_scenario(path)  # loading alone (the key reference, the loader tests) still accepts it
    path.write_text(RUNNABLE)  # the fixed twin: one request
    assert load_scenario(path, runnable=True).workload.requests[0].id == "A"


def test_the_command_line_refuses_it_with_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.toml").write_text("")
    assert main(["run", "--no-reports", "-q", str(tmp_path / "empty.toml")]) == 2
    assert capsys.readouterr().err == f"{tmp_path}/empty.toml: {NOTHING}\n"
