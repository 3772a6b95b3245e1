"""What the SGLang tests share: a tree of the installed SGLang with one file edited, the
``overlap-harness sglang`` command run on it, and a child process that imports SGLang once
and prints its findings as one ``RESULT`` line.

The tests that remove a sync from a copy of SGLang's file, or run many variants in one
child, each had their own copy of these; one copy here keeps them alike (the same skip
reasons, the same line numbering of an edited file).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_INSTALLED = "sglang is not installed (docs/sglang-loop.md: install)"


def installed_sglang() -> Path:
    """The installed ``sglang`` package's folder; the test skips when there is none."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip(NOT_INSTALLED)
    return Path(spec.submodule_search_locations[0])


def mirror(source: Path, target: Path, relative: Path, edit: Callable[[str], str]) -> None:
    """``target`` mirrors the folder ``source`` with symlinks, except the file ``relative``:
    a real copy, its text passed through ``edit``."""
    target.mkdir()
    head = relative.parts[0]
    for entry in source.iterdir():
        if entry.name == head and len(relative.parts) > 1:
            mirror(entry, target / head, Path(*relative.parts[1:]), edit)
        elif entry.name == head:
            (target / head).write_text(edit(entry.read_text()))
        elif entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)


def edited_tree(tmp_path: Path, relative: str, edit: Callable[[str], str],
                package: Path | None = None, name: str = "tree") -> Path:
    """A tree (``tmp_path/name/sglang``) of ``package`` (the installed SGLang by default)
    whose file ``relative`` (under ``sglang/``) is ``edit`` of the original."""
    tree = tmp_path / name
    tree.mkdir()
    mirror(package or installed_sglang(), tree / "sglang", Path(relative), edit)
    return tree


def unchanged(text: str) -> str:
    """The edit that changes nothing: a fixed twin's tree."""
    return text


def statement_passed(function: str, code: str) -> Callable[[str], str]:
    """The edit that makes the expression statement holding ``code`` in ``function`` a
    ``pass`` (same indentation; every line keeps its number). Found by the file's syntax
    tree, never by a line number; fails when the function or the statement is missing."""
    def edit(text: str) -> str:
        owner = next((node for node in ast.walk(ast.parse(text))
                      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                      and node.name == function), None)
        assert owner is not None, f"{function} is not in the file any more"
        line = next((node.lineno for node in ast.walk(owner) if isinstance(node, ast.Expr)
                     and code in ast.unparse(node)), None)
        assert line is not None, f"{code} is not in {function} any more"
        lines = text.splitlines(keepends=True)
        first = lines[line - 1]
        lines[line - 1] = first[: len(first) - len(first.lstrip())] + "pass\n"
        return "".join(lines)
    return edit


def line_replaced(old: str, new: str = "pass") -> Callable[[str], str]:
    """The edit that makes the first line reading ``old`` (stripped) ``new``, at the same
    indentation (every line keeps its number)."""
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        index = next((i for i, line in enumerate(lines) if line.strip() == old), None)
        assert index is not None, f"{old} is not in the file any more"
        indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
        lines[index] = f"{indent}{new}\n"
        return "".join(lines)
    return edit


def statement_at(line: int) -> Callable[[str], str]:
    """The edit that makes the statement starting at ``line`` a ``pass`` (its other lines
    blank: every line keeps its number)."""
    def edit(text: str) -> str:
        statement = next(node for node in ast.walk(ast.parse(text))
                         if isinstance(node, ast.stmt) and node.lineno == line)
        lines = text.splitlines(keepends=True)
        first = lines[line - 1]
        lines[line - 1] = first[: len(first) - len(first.lstrip())] + "pass\n"
        for index in range(line, statement.end_lineno or line):
            lines[index] = "\n"
        return "".join(lines)
    return edit


def run_sglang(*args: str, json_path: Path, timeout: int = 900) -> tuple[int, str, dict]:
    """``overlap-harness sglang ARGS --json JSON_PATH``: exit status, output, the JSON (empty
    when none was written). A tree whose import fails here (not the harness's fault: a
    missing package) skips the test with the import's line."""
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", *args, "--json",
                           str(json_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout,
                          check=False)
    output = done.stdout + done.stderr
    if done.returncode == 2 and "overlap-harness sglang: import " in output:
        pytest.skip(output.strip().splitlines()[-1])
    document = json.loads(json_path.read_text()) if json_path.exists() else {}
    return done.returncode, output, document


#: a child's first lines: SGLang's tree loaded as the command loads it, exit 3 if it cannot
CHILD_PRELUDE = """
import sys
from overlap_harness.engines.sglang import environment
try:
    environment.load()
except environment.SglangTreeError as exc:
    print("SKIP", exc); sys.exit(3)
"""


#: child code that keeps every grammar SGLang's grammar path builds (``grammars``, in order),
#: for the tests that check the grammar objects advanced on SGLang's own path
GRAMMAR_SPY = """
from overlap_harness.engines.sglang.features import grammar
grammars = []
constrain = grammar.constrain
def spy(req):
    constrain(req)
    grammars.append(req.grammar)
grammar.constrain = spy
"""


def run_child(code: str, *args: Any, timeout: int = 900) -> Any:
    """``code`` (after :data:`CHILD_PRELUDE`) in a child process, each of ``args`` passed as
    JSON in ``sys.argv``; returns the JSON it printed after ``RESULT``. Skips when SGLang is
    not installed or its tree cannot be loaded."""
    installed_sglang()
    done = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + code,
                           *(json.dumps(arg) for arg in args)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=timeout, check=False)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def release_package(version: str) -> Path:
    """The ``sglang`` package of a supported release's unzipped wheel (fetched into the
    user's cache); the test skips with the reason where it cannot be had."""
    from overlap_harness.engines.sglang import releases

    try:
        return releases.release_tree(version) / "sglang"
    except releases.ReleaseUnavailable as exc:
        pytest.skip(str(exc))


def release_versions() -> list[str]:
    """Every supported SGLang release, oldest first (a test's parameters)."""
    from overlap_harness.engines.sglang import releases

    return list(releases.SUPPORTED)
