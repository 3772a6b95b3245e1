"""A tree that does not import is named by its own file and line, relative to the tree root
(engines/core/tree_errors.py): a syntax error, a missing module imported by the tree, an
exception raised at import time; a file outside the tree keeps its own path. Each case
imports a small package written here, in a child process (the import machinery's own
frames are in the traceback, as they are when an engine's tree fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""\
    import importlib, json, sys
    from pathlib import Path
    from overlap_harness.engines.core.tree_errors import import_failure
    root = Path(sys.argv[1])
    sys.path.insert(0, str(root))
    try:
        importlib.import_module("engine.outer")
    except Exception as exc:
        print(json.dumps(import_failure(exc, root)))
    """)


def _failure(tree: Path, files: dict[str, str]) -> str:
    for name, text in {"engine/__init__.py": "", **files}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(textwrap.dedent(text))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return json.loads(done.stdout)


def test_a_syntax_error_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    line = _failure(tmp_path, {"engine/outer.py": "from engine import inner\n",
                               "engine/inner.py": "x = 1\n\ndef f(:\n    pass\n"})
    assert line.startswith("engine/inner.py:3: SyntaxError: ")


def test_a_missing_module_is_named_at_the_trees_import_line(tmp_path: Path) -> None:
    line = _failure(tmp_path, {"engine/outer.py": "import os\nimport no_such_package_here\n"})
    assert line == ("engine/outer.py:2: ModuleNotFoundError: No module named "
                    "'no_such_package_here'")


def test_an_exception_at_import_is_named_at_the_innermost_tree_line(tmp_path: Path) -> None:
    line = _failure(tmp_path, {"engine/outer.py": "from engine.inner import VALUE\n",
                               "engine/inner.py": """\
                                   def build():
                                       raise ValueError("bad\\n  configuration")

                                   VALUE = build()
                                   """})
    assert line == "engine/inner.py:2: ValueError: bad configuration"


@pytest.mark.parametrize("inside", [True, False])
def test_a_file_outside_the_tree_keeps_its_path(tmp_path: Path, inside: bool) -> None:
    """The tree root is the folder that holds the package: a sibling folder is outside it,
    even when its name starts with the root's."""
    from overlap_harness.engines.core.tree_errors import import_failure

    root = tmp_path / "tree"
    where = root / "engine" / "x.py" if inside else tmp_path / "tree2" / "x.py"
    error = SyntaxError("invalid syntax", (str(where), 7, 1, "x +\n"))
    shown = "engine/x.py" if inside else str(where)
    assert import_failure(error, root) == f"{shown}:7: SyntaxError: invalid syntax"
