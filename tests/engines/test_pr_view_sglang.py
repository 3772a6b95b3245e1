"""``overlap-harness sglang --sglang-src HEAD --base BASE`` on twins of the installed SGLang
(mirrors: every file a link to the installed one, the edited file a real copy). Each case
edits one statement the way a pull request would and checks the view's verdict, computed by
the detector and coverage.py in the two trees' runs: a removed necessary sync and a moved
event record race (exit 1, attributed to that change), a harmless reached edit passes
(exit 0, reached), a removed sync on a path no variant runs is listed as unreached (exit 2),
and the intact tree against a base without the sync lists the base's races as fixed. The
removed-sync case runs the command of the CI workflow (docs/examples/overlap-harness-pr.yml)
as written there. Slow: each case runs both trees (about 35 CPU s)."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "examples" / "overlap-harness-pr.yml"
SCHEDULER = "sglang/srt/managers/scheduler.py"
FORWARD_WAIT = "self.forward_stream.wait_stream(self.schedule_stream)"  # run_batch's first
VARIANT = "non_spec_decode"


def _installed() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    return Path(spec.submodule_search_locations[0])


def _twin(tmp_path: Path, name: str) -> Path:
    tree = tmp_path / name
    tree.mkdir()
    subprocess.run(["cp", "-rs", str(_installed()), str(tree / "sglang")], check=True)
    return tree


def _edit(tree: Path, relative: str, edit: Callable[[list[str]], None]) -> list[str]:
    """Make ``relative`` a real file of the twin, edited in place by ``edit`` (its lines)."""
    path = tree / relative
    lines = path.read_text().splitlines(keepends=True)
    edit(lines)
    path.unlink()
    path.write_text("".join(lines))
    return lines


def _index(lines: list[str], code: str, after: str | None = None) -> int:
    start = 0 if after is None else next(i for i, line in enumerate(lines)
                                         if line.strip() == after)
    return next(i for i in range(start, len(lines)) if lines[i].strip() == code)


def workflow_command() -> list[str]:
    """The comparison step's command of the CI workflow, split as the shell splits it."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["overlap"]["steps"]
    runs = [s["run"] for s in steps if "overlap-harness sglang" in s.get("run", "")]
    assert len(runs) == 1, runs
    return shlex.split(runs[0])


def _view(head: Path, base: Path, tmp_path: Path, *extra: str) -> tuple[int, str, dict, dict]:
    """Run the workflow's command with HEAD, BASE and the outputs here, one variant."""
    command = workflow_command()
    assert command[0].endswith("overlap-harness") and command[1] == "sglang"
    swapped = {"--sglang-src": str(head), "--base": str(base),
               "--json": str(tmp_path / "pr.json"), "--sarif": str(tmp_path / "pr.sarif")}
    args = [swapped.get(command[i - 1], arg) for i, arg in enumerate(command)][2:]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", *args,
                           "--variant", VARIANT, *extra], capture_output=True, text=True,
                          env=env, timeout=900, check=False)
    output = done.stdout + done.stderr
    document = json.loads((tmp_path / "pr.json").read_text())
    sarif = json.loads((tmp_path / "pr.sarif").read_text())
    return done.returncode, output, document, sarif


def _counts(document: dict) -> str:
    """``N new races (M occurrences)`` as counted from the JSON's races, by hand."""
    races = document["races"]
    occurrences = sum(r["count"] for r in races)
    return (f"{len(races)} new race{'s' if len(races) != 1 else ''} "
            f"({occurrences} occurrence{'s' if occurrences != 1 else ''})")


def _place(side: dict) -> str:
    """A racing side's line in the tree (a stand-in's: the tree line that called it)."""
    shown = side if side["in_tree"] else side["stands_in_for"]
    return f"{shown['file']}:{shown['line']}"


@pytest.mark.engine_run
def test_a_removed_necessary_sync_races_and_names_the_removal(tmp_path: Path) -> None:
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    index = -1

    def remove(lines: list[str]) -> None:
        nonlocal index
        index = _index(lines, FORWARD_WAIT)
        del lines[index]
    _edit(head, SCHEDULER, remove)
    status, output, document, sarif = _view(head, base, tmp_path)
    assert status == 1, output
    # the statement now at the removal's place (its next line) is where the change is named
    where = f"{SCHEDULER}:{index + 1}"
    assert document["races"] and {r["change"] for r in document["races"]} == {where}
    assert all(FORWARD_WAIT in r["what"] and r["what"].startswith("removed")
               for r in document["races"])
    report = output[output.index(f"\n{where} ") + 1:]  # after the two trees' progress lines
    verdict_line = report.splitlines()[0]
    assert verdict_line.startswith(f"{where} removed `{FORWARD_WAIT}`: ")
    counts = _counts(document)
    assert verdict_line.endswith(f": {counts} in {VARIANT}") and len(verdict_line) <= 200
    assert f"\nnew races of the change at {where}: {counts}" in report
    assert f"\n    fix: restore the removed `{FORWARD_WAIT}`\n" in report
    assert output.rstrip().splitlines()[-1] == f"overlap-harness sglang: {counts}"  # stderr
    assert document["changes"][0]["reached_by"] == [VARIANT]
    results = sarif["runs"][0]["results"]
    located = {(loc["physicalLocation"]["artifactLocation"]["uri"],
                loc["physicalLocation"]["region"]["startLine"])
               for result in results for loc in result["locations"]}
    assert located == {(SCHEDULER, index + 1)}
    related = [loc["physicalLocation"]["artifactLocation"]["uri"]
               for result in results for loc in result["relatedLocations"]]
    assert len(related) == 2 * len(results)
    assert all(uri.startswith("sglang/") for uri in related)
    pairs = {(_place(r["first"]), _place(r["second"])) for r in document["races"]}
    assert len(results) == len(pairs)  # one result per pair of racing sites
    sides = [s for r in document["races"] for s in (r["first"], r["second"])]
    assert all(not Path(s["file"]).is_absolute() for s in sides if s["in_tree"])
    assert all(s["stack"] and not Path(s["stack"][0]["file"]).is_absolute() for s in sides)


@pytest.mark.engine_run
def test_a_moved_event_record_races_at_the_moved_line(tmp_path: Path) -> None:
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    relative = "sglang/srt/managers/utils.py"
    record = "self.copy_done.record()"
    copy = "self.next_token_ids = _async_d2h(self.next_token_ids)"
    moved_to = -1

    def move(lines: list[str]) -> None:
        nonlocal moved_to
        line = lines.pop(_index(lines, record))
        moved_to = _index(lines, copy)
        lines.insert(moved_to, line)  # recorded before the token ids' copy is issued
    _edit(head, relative, move)
    status, output, document, _sarif = _view(head, base, tmp_path)
    assert status == 1, output
    assert {r["change"] for r in document["races"]} == {f"{relative}:{moved_to + 1}"}
    assert all(r["what"].startswith(f"moved `{record}`") for r in document["races"])
    verdicts = [line for line in output.splitlines() if line.startswith(f"{relative}:")]
    assert len(verdicts) == 1 and f"moved `{record}`" in verdicts[0]  # the move: one verdict
    assert f"fix: move `{record}` back to where BASE has it (line " in output


@pytest.mark.engine_run
def test_a_harmless_reached_edit_passes_and_is_reached(tmp_path: Path) -> None:
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")

    def insert(lines: list[str]) -> None:
        index = _index(lines, FORWARD_WAIT)
        indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
        lines.insert(index + 1, f"{indent}_reviewed = True\n")
    _edit(head, SCHEDULER, insert)
    status, output, document, sarif = _view(head, base, tmp_path)
    assert status == 0, output
    assert document["races"] == [] and document["unreached"] == []
    assert [c["reached_by"] for c in document["changes"]] == [[VARIANT]]
    assert sarif["runs"][0]["results"] == []


@pytest.mark.engine_run
def test_a_removed_sync_no_variant_runs_is_unreached(tmp_path: Path) -> None:
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    relative = "sglang/srt/managers/scheduler_components/batch_result_processor.py"
    sync = "result.copy_done.synchronize()"
    index = -1

    def replace(lines: list[str]) -> None:  # the grammar path's wait for the result copy
        nonlocal index
        index = _index(lines, sync,
                       after="if result.grammar_advanced or not batch.has_grammar:")
        lines[index] = lines[index].replace(sync, "pass")
    _edit(head, relative, replace)
    status, output, document, _sarif = _view(head, base, tmp_path)
    assert status == 2, output
    assert document["unreached"] == [{"file": relative, "line": index + 1,
                                      "kind": "synchronize", "code": sync, "removed": True,
                                      "base_line": index + 1}]
    [message] = [line for line in output.splitlines() if "--allow-unreached" in line]
    assert message.startswith("overlap-harness sglang: changed stream-ordering lines no "
                              "variant ran") and f"{relative}:{index + 1} `{sync}`" in message
    assert document["changes"][0]["reached_by"] == []


@pytest.mark.engine_run
def test_an_edit_that_restores_a_sync_lists_the_base_races_as_fixed(tmp_path: Path) -> None:
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    _edit(base, SCHEDULER, lambda lines: lines.__delitem__(_index(lines, FORWARD_WAIT)))
    status, output, document, _sarif = _view(head, base, tmp_path)
    assert status == 0, output
    assert document["races"] == []
    assert document["races_fixed"] and all(VARIANT in r["variants"]
                                           for r in document["races_fixed"])
    assert "races fixed" in output


@pytest.mark.engine_run
def test_a_removed_plan_stream_wait_names_it_and_the_calls_stand_ins_play(
        tmp_path: Path) -> None:
    """The EAGLE v2 verify's plan-stream wait (a statement over three lines) replaced by
    ``pass``: every new race names it, and a side in the harness's stand-in code names the
    SGLang call it stands in for."""
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    relative = "sglang/srt/speculative/eagle_worker_v2.py"
    first = -1

    def replace(lines: list[str]) -> None:
        nonlocal first
        first = _index(lines, "self.plan_stream.wait_stream(")
        assert lines[first + 2].strip() == ")"
        indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
        lines[first:first + 3] = [f"{indent}pass\n"]
    _edit(head, relative, replace)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(head), "--base", str(base), "--variant", "eagle_topk1",
                           "--json", str(tmp_path / "pr.json")], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    document = json.loads((tmp_path / "pr.json").read_text())
    assert {r["change"] for r in document["races"]} == {f"{relative}:{first + 1}"}
    stand_ins = [s for r in document["races"] for s in (r["first"], r["second"])
                 if not s["in_tree"]]
    assert stand_ins and all(s["file"].startswith("overlap_harness/engines/")
                             and s["stands_in_for"]["file"].startswith("sglang/")
                             and s["stands_in_for"]["code"] for s in stand_ins)


@pytest.mark.engine_run
def test_the_forward_waits_removal_in_every_variant_is_one_short_verdict(
        tmp_path: Path) -> None:
    """The forward stream's entry wait removed, every variant run (no ``--variant``): exit 1,
    each verdict line at most 200 characters, the variants summed up, every race with its
    sentence and fix in the JSON, the text's fix hint leading with "fix"."""
    head, base = _twin(tmp_path, "head"), _twin(tmp_path, "base")
    index = -1

    def remove(lines: list[str]) -> None:
        nonlocal index
        index = _index(lines, FORWARD_WAIT)
        del lines[index]
    _edit(head, SCHEDULER, remove)
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(head), "--base", str(base), "-j", "2", "--json",
                           str(tmp_path / "pr.json")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800,
                          check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((tmp_path / "pr.json").read_text())
    where = f"{SCHEDULER}:{index + 1}"
    verdicts = [line for line in done.stdout.splitlines() if line.startswith(f"{where} ")]
    assert len(verdicts) == 1 and all(len(line) <= 200 for line in verdicts)
    ran = [v for v in document["variants"] if v not in document["errors"]
           and v not in document["not_applicable"]]
    raced = {v for r in document["races"] for v in r["variants"]}
    assert len(raced) > 1 and f" in {len(raced)} variants, first " in verdicts[0]
    assert verdicts[0].split(", first ")[1] == next(v for v in ran if v in raced)
    assert verdicts[0].endswith(f"{_counts(document)} in {len(raced)} variants, first "
                                f"{next(v for v in ran if v in raced)}")
    assert done.stderr.rstrip().splitlines()[-1] == f"overlap-harness sglang: {_counts(document)}"
    assert f"\n    fix: restore the removed `{FORWARD_WAIT}`\n" in done.stdout
    assert all(r["fix"] == f"fix: restore the removed `{FORWARD_WAIT}`"
               and r["explanation"].endswith(".") for r in document["races"])
