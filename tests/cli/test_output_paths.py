"""Every command's output paths are prepared before any work: a missing folder is made, a bad
path is one line and exit 2 (overlap_harness/output_paths.py).

Each command is run in this process with its work replaced by a strict stand-in that raises
KeyboardInterrupt (exit 130): a bad path must stop the command before it (exit 2, one line),
a good one must reach it with the folder made.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from overlap_harness import calibrate_cmd, cli, runner
from overlap_harness.cli import main
from overlap_harness.output_paths import OutputPathError, prepare_outputs
from tests.cli.conftest import TWIN, write

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
LONG = "n" * 300  # one name longer than any common file system allows (255 bytes)


def work_reached(*_args, **_kwargs):
    """The command's work: reached only when every output path was good."""
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Case:
    """One output option of one command: its argv (``{path}`` for the output, ``{twin}`` for
    a scenario, ``{script}`` for a Python script), whether it names a file or a folder, the
    suffix the command adds to it (plot's stem), and where its work starts."""

    command: str
    option: str
    argv: tuple[str, ...]
    kind: str  # "file" | "folder"
    stub: Callable[[pytest.MonkeyPatch], None]
    suffix: str = ""


def _stub_runs(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(runner, "run_scenarios", work_reached)


def _stub_plot(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(runner, "run_spec", work_reached)


def _stub_gpu_check(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.replay import suite

    mp.setattr(suite, "run_gpu_check", work_reached)
    mp.setattr(cli, "_check_memory", work_reached)  # its scenario load comes after the paths


def _stub_check(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.recorder import api

    mp.setattr(api, "check_script", work_reached)


def _stub_conformance(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.conformance import sglang_env

    mp.setattr(sglang_env, "unavailable_reason", work_reached)


def _stub_sglang_loop(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.sglang import environment

    mp.setattr(environment, "load", work_reached)


def _stub_vllm(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.vllm import environment as vllm_environment

    mp.setattr(vllm_environment, "load", work_reached)


def _stub_tokenspeed(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.tokenspeed import environment as tokenspeed_environment

    mp.setattr(tokenspeed_environment, "load", work_reached)


def _stub_sglang_gpu(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.sglang.gpu import command as gpu_command

    mp.setattr(gpu_command, "run", work_reached)


def _stub_pr_view(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness.engines.core.pr_view import view

    mp.setattr(view, "run", work_reached)


def _stub_measure(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(calibrate_cmd, "measure_profile", work_reached)


def _stub_compare(mp: pytest.MonkeyPatch) -> None:
    from overlap_harness import profile_check

    mp.setattr(profile_check, "compare_command", work_reached)


CASES = [
    Case("run", "--out", ("run", "-q", "-j", "1", "{twin}", "--out", "{path}"), "folder",
         _stub_runs),
    Case("run", "--json", ("run", "-q", "--no-reports", "{twin}", "--json", "{path}"), "file",
         _stub_runs),
    Case("run", "--junit", ("run", "-q", "--no-reports", "{twin}", "--junit", "{path}"),
         "file", _stub_runs),
    Case("report", "--out", ("report", "-q", "-j", "1", "{twin}", "--out", "{path}"),
         "folder", _stub_runs),
    Case("plot", "--out", ("plot", "{twin}", "--out", "{path}"), "file", _stub_plot, ".png"),
    Case("gpu-check", "--out", ("gpu-check", "{twin}", "--out", "{path}"), "folder",
         _stub_gpu_check),
    Case("check", "--out", ("check", "--cpu", "--out", "{path}", "{script}"), "folder",
         _stub_check),
    Case("check", "--json", ("check", "--cpu", "--json", "{path}", "{script}"), "file",
         _stub_check),
    Case("conformance", "--out", ("conformance", "--out", "{path}"), "folder",
         _stub_conformance),
    Case("sglang", "--out", ("sglang", "--out", "{path}"), "folder", _stub_sglang_loop),
    Case("sglang", "--json", ("sglang", "--json", "{path}"), "file", _stub_sglang_loop),
    Case("sglang", "--loop-report", ("sglang", "--necessity", "--loop-report", "{path}"),
         "folder", _stub_sglang_loop),
    Case("calibrate", "--out", ("calibrate", "--out", "{path}"), "file", _stub_measure),
    Case("calibrate", "--timelines", ("calibrate", "--out", "{tmp}/p.json", "--timelines",
                                      "{path}"), "file", _stub_measure),
    Case("calibrate", "--report-out", ("calibrate", "--compare", "{tmp}/r.json", "--profile",
                                       "{tmp}/p.json", "--report-out", "{path}"), "folder",
         _stub_compare),
    Case("sglang", "--gpu-report", ("sglang", "--gpu", "--gpu-report", "{path}"), "folder",
         _stub_sglang_gpu),
    Case("sglang", "--sarif", ("sglang", "--base", "{tmp}", "--sarif", "{path}"), "file",
         _stub_pr_view),
    Case("vllm", "--sarif", ("vllm", "--base", "{tmp}", "--sarif", "{path}"), "file",
         _stub_pr_view),
    Case("vllm", "--out", ("vllm", "--out", "{path}"), "folder", _stub_vllm),
    Case("vllm", "--json", ("vllm", "--json", "{path}"), "file", _stub_vllm),
    Case("tokenspeed", "--sarif", ("tokenspeed", "--base", "{tmp}", "--sarif", "{path}"),
         "file", _stub_pr_view),
    Case("tokenspeed", "--out", ("tokenspeed", "--out", "{path}"), "folder", _stub_tokenspeed),
    Case("tokenspeed", "--json", ("tokenspeed", "--json", "{path}"), "file", _stub_tokenspeed),
]
# options with a FILE metavar that name what a command reads (``--gpu-check-cpu`` reads a GPU
# report that must exist, and rewrites it where it lies)
INPUT_OPTIONS = {"--profile", "--loop-json", "--gpu-resume", "--gpu-check-cpu"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_output_option_of_every_command_is_a_case() -> None:
    """A new command or output option (a FILE or DIR, or any --out) needs its case above."""
    found = {(name, option) for name, parser in _subparsers().items()
             for action in parser._actions for option in action.option_strings[-1:]
             if (action.metavar in ("FILE", "DIR") or action.dest == "out"
                 or action.dest.endswith("_out"))
             and option not in INPUT_OPTIONS}
    assert found == {(c.command, c.option) for c in CASES}


def _bad_paths(tmp: Path) -> dict[str, tuple[str, str, str]]:
    """Kind -> (the folder path, the file's path less its suffix, the line's reason with
    {flag}, {path} and {existing})."""
    a_file = tmp / "a_file"
    a_file.write_text("")
    unwritable = "/sys/kernel" if ROOT else str(tmp / "locked")
    if not ROOT:
        (tmp / "locked").mkdir()
        (tmp / "locked").chmod(0o500)
    virtual_reason = "{flag} {path}: {existing} is on a virtual file system, not storage: " \
                     "give a folder on a disk"
    return {
        "a file where a folder goes": (str(a_file), f"{a_file}/x",
                                       "{flag} {path}: is a file, not a folder"),
        "under /proc": ("/proc/nope/x", "/proc/nope/x", virtual_reason),
        "unwritable": (unwritable, f"{unwritable}/x",
                       virtual_reason if ROOT else "{flag} {path}: is not writable"),
        "name too long": (str(tmp / LONG), str(tmp / LONG / "x"),
                          "{flag} {path}: the name " + "n" * 40 + "... is 300 bytes long; "
                          "the file system allows at most 255: choose a shorter name"),
    }


def _shown(path: str) -> str:
    return path if len(path) <= 120 else f"{path[:58]}...{path[-58:]} ({len(path)} characters)"


def _argv(case: Case, tmp: Path, path: str) -> list[str]:
    twin = write(tmp, "twin.toml", TWIN)
    script = tmp / "prog.py"
    script.write_text("print('never run')\n")
    names = {"path": path, "twin": str(twin), "script": str(script), "tmp": str(tmp)}
    return [a.format(**names) for a in case.argv]


@pytest.mark.parametrize("kind", ["a file where a folder goes", "under /proc", "unwritable",
                                  "name too long"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command} {c.option}")
def test_a_bad_output_path_is_one_line_and_exit_2_before_any_work(
        case: Case, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    if kind == "unwritable" and ROOT and not Path("/sys/kernel").is_dir():
        pytest.skip("as root, chmod does not stop a write, and this machine has no /sys")
    case.stub(monkeypatch)
    monkeypatch.chdir(tmp_path)
    folder, stem, reason = _bad_paths(tmp_path)[kind]
    if case.kind == "folder":
        given, flag, path = folder, case.option, folder
    else:  # plot is given a stem and adds .png; the others are given the file
        given = stem if case.suffix else stem + ".json"
        written = stem + (case.suffix or ".json")
        flag, path = f"{case.option} folder", str(Path(written).parent)
        if kind == "name too long":
            flag, path = case.option, written  # refused as a whole, before its folder
    existing = "/proc" if kind == "under /proc" else path
    assert main(_argv(case, tmp_path, given)) == 2
    err = capsys.readouterr().err
    assert err == "overlap-harness: " + reason.format(
        flag=flag, path=_shown(path), existing=existing) + "\n"


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "file"],
                         ids=lambda c: f"{c.command} {c.option}")
def test_a_folder_given_as_an_output_file_is_refused(
        case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    case.stub(monkeypatch)
    folder = tmp_path / f"a_folder{case.suffix}"
    folder.mkdir()
    assert main(_argv(case, tmp_path, str(tmp_path / "a_folder"))) == 2
    assert capsys.readouterr().err == (f"overlap-harness: {case.option} {folder}: is a folder; "
                                       "give a file name\n")


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.command} {c.option}")
def test_a_missing_folder_is_made_and_the_work_starts(
        case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    case.stub(monkeypatch)
    monkeypatch.chdir(tmp_path)
    new = tmp_path / "new" / "deeper"
    given = new if case.kind == "folder" else new / "x"
    assert main(_argv(case, tmp_path, str(given))) == cli.EXIT_INTERRUPTED
    assert new.is_dir()
    assert not [p for p in new.iterdir() if p.name.startswith(".overlap-harness-probe")]


# --- the rule itself ------------------------------------------------------------------------

def test_none_and_stdout_are_skipped_and_an_existing_file_is_left_as_it_is(
        tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    prepare_outputs(files={"--json": "-", "--junit": None, "--x": kept},
                    folders={"--out": None})
    assert kept.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json"]


def test_a_file_behind_a_file_names_the_file_in_the_way(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(OutputPathError) as info:
        prepare_outputs(folders={"--out": blocker / "a" / "b"})
    assert str(info.value) == (f"--out {blocker}/a/b: {blocker} is not a folder, so "
                               f"{blocker}/a/b cannot be made")


@pytest.mark.skipif(ROOT, reason="root writes to a read-only folder: chmod cannot make one")
def test_an_existing_file_that_is_not_writable_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked.json"
    locked.write_text("")
    locked.chmod(0o400)
    with pytest.raises(OutputPathError, match="is not writable"):
        prepare_outputs(files={"--json": locked})


def test_a_path_longer_than_the_file_system_allows_is_refused(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 200] * 25)  # 5,000 bytes of 200-byte names
    with pytest.raises(OutputPathError, match=r"the path is \d+ bytes long; the file system "
                                              r"allows fewer than \d+"):
        prepare_outputs(folders={"--out": deep})
    assert not (tmp_path / ("d" * 200)).exists()  # refused before anything was made
