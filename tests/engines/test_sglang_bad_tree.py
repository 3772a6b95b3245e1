"""A user's SGLang tree with a syntax error in scheduler.py: ``overlap-harness sglang`` exits 2
with one last line naming the tree's file:line (relative to the tree root) and the
SyntaxError, and writes the JSON with that error; so does the pull request's view
(``--base``), whose other tree's run is stopped rather than waited for. The fixed twin (the
same tree without the error) is the tree every other SGLang test drives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.sglang_trees import ROOT, edited_tree, installed_sglang, unchanged

SCHEDULER = "srt/managers/scheduler.py"
WAIT = "self.forward_stream.wait_stream(self.schedule_stream)"


def _broken(text: str) -> str:
    """The scheduler with its first forward-stream wait followed by a dangling ``+``."""
    return text.replace(WAIT, WAIT + " +", 1)


def _line_of_error(tree: Path) -> int:
    lines = (tree / "sglang" / SCHEDULER).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(WAIT + " +"))


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", *args],
                          capture_output=True, text=True, timeout=900, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.engine_run
def test_a_syntax_error_exits_2_naming_the_trees_line_and_writes_the_json(
        tmp_path: Path) -> None:
    installed_sglang()
    tree = edited_tree(tmp_path, SCHEDULER, _broken)
    line = _line_of_error(tree)
    done = _command("--sglang-src", str(tree), "--json", str(tmp_path / "out.json"))
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"overlap-harness sglang: import sglang.srt.managers.scheduler failed: "
                    f"sglang/{SCHEDULER}:{line}: SyntaxError: invalid syntax")
    assert "Traceback" not in done.stderr
    document = json.loads((tmp_path / "out.json").read_text())
    assert document["errors"] == [last.removeprefix("overlap-harness sglang: ")]
    assert document["races"] == []


@pytest.mark.engine_run
def test_a_syntax_error_in_the_pull_requests_tree_exits_2_at_once(tmp_path: Path) -> None:
    installed_sglang()
    head = edited_tree(tmp_path, SCHEDULER, _broken, name="head")
    base = edited_tree(tmp_path, SCHEDULER, unchanged, name="base")
    line = _line_of_error(head)
    done = _command("--sglang-src", str(head), "--base", str(base), "-j", "2",
                    "--variant", "non_spec_decode", "--json", str(tmp_path / "pr.json"))
    assert done.returncode == 2, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"overlap-harness sglang: the HEAD tree cannot be driven: import "
                    f"sglang.srt.managers.scheduler failed: sglang/{SCHEDULER}:{line}: "
                    "SyntaxError: invalid syntax")
    document = json.loads((tmp_path / "pr.json").read_text())
    assert document["fatal"] == last.removeprefix("overlap-harness sglang: ")
    assert document["exit"]["status"] == 2 and document["races"] == []
