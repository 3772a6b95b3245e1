"""``overlap-harness tokenspeed --out`` and ``--base`` on copies of the installed TokenSpeed:
with the output copy's event record removed, ``--out`` writes the JSON, each variant's plot,
Perfetto trace and SARIF, the SARIF locating the races in the tree's own files; and the pull
request view of a tree whose execution stream no longer waits on the default stream before a
forward (the released tree as its base) exits 1 naming that line as the change, while the
released tree against that base lists the base's races as fixed. Verdicts are the detector's
and coverage.py's. Skipped where TokenSpeed is not importable; slow (each case runs whole
trees in children)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.tokenspeed.conftest import tree_copy

pytestmark = pytest.mark.slow

EXECUTOR = "runtime/execution/model_executor.py"
WAIT = "self.execution_stream.wait_stream(self.default_stream)"
VARIANT = "plain_decode"


def _forward_wait_line(tree: Path) -> int:
    """The line of the wait before a forward (execute_forward_op's, not the cache lengths')."""
    lines = (tree / "tokenspeed" / EXECUTOR).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "def execute_forward_op(" in line)
    return next(i for i in range(start, len(lines)) if lines[i].strip() == WAIT) + 1


def _without_forward_wait(tree: Path, target: Path) -> tuple[Path, int]:
    copy = tree_copy(tree, target, {})
    path = copy / "tokenspeed" / EXECUTOR
    lines = path.read_text().splitlines(keepends=True)
    number = _forward_wait_line(copy)
    lines[number - 1] = lines[number - 1].replace(WAIT, "pass")  # the block keeps a statement
    path.write_text("".join(lines))
    return copy, number


def _command(*arguments: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overlap_harness", "tokenspeed", *arguments],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_out_writes_the_json_plots_perfetto_and_sarif_of_a_racy_tree(
        tokenspeed_tree: Path, tmp_path: Path) -> None:
    tree = tree_copy(tokenspeed_tree, tmp_path / "tree",
                     {EXECUTOR: [("                copy_event.record()\n",
                                  "                pass\n")]})
    out = tmp_path / "out"
    done = _command("--tokenspeed-src", str(tree), "--variant", VARIANT, "--out", str(out))
    assert done.returncode == 1, done.stderr
    document = json.loads((out / "tokenspeed.json").read_text())
    assert document["races"]
    variant = out / VARIANT
    assert list((variant / "plots").rglob("*.png"))
    trace = json.loads((variant / "trace.json").read_text())
    assert trace["traceEvents"]
    sarif = json.loads((variant / "results.sarif").read_text())
    results = sarif["runs"][0]["results"]
    assert results
    located = {location["physicalLocation"]["artifactLocation"]["uri"]
               for result in results for location in result["locations"]}
    assert any(uri.endswith(("runtime/engine/event_loop.py",
                             "runtime/sampling/backends/flashinfer.py")) for uri in located), (
        located)


def _view(tree: Path, tmp_path: Path, head_without_wait: bool) -> tuple[int, str, dict, int]:
    """The pull request view of a tree without the forward's wait and the released tree, the
    one without it as HEAD or as BASE; exit status, output, JSON, the wait's line."""
    without, number = _without_forward_wait(tree, tmp_path / "without")
    released = tree_copy(tree, tmp_path / "released", {})
    head, base = (without, released) if head_without_wait else (released, without)
    done = _command("--tokenspeed-src", str(head), "--base", str(base), "--variant", VARIANT,
                    "-j", "2", "--json", str(tmp_path / "pr.json"))
    return (done.returncode, done.stdout + done.stderr,
            json.loads((tmp_path / "pr.json").read_text()), number)


def test_a_removed_forward_wait_races_and_is_named(tokenspeed_tree: Path,
                                                   tmp_path: Path) -> None:
    status, output, document, number = _view(tokenspeed_tree, tmp_path, True)
    assert status == 1, output
    assert {race["change"] for race in document["races"]} == {
        f"tokenspeed/{EXECUTOR}:{number}"}, document["races"]
    assert document["changes"][0]["reached_by"] == [VARIANT]


def test_restoring_the_forward_wait_fixes_the_base_races(tokenspeed_tree: Path,
                                                          tmp_path: Path) -> None:
    status, output, document, _number = _view(tokenspeed_tree, tmp_path, False)
    assert status == 0, output
    assert document["races"] == [] and document["races_fixed"]
