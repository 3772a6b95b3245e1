"""TokenSpeed's tests: skipped, with the import error as the reason, where TokenSpeed (0.1.1,
``pip install --no-deps tokenspeed==0.1.1``) is not importable; CI does not install it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def installed_tree() -> Path:
    """The folder holding the installed ``tokenspeed`` package, or a skip saying why not."""
    from overlap_harness.engines.tokenspeed import environment

    try:
        info = environment.import_tokenspeed()
    except environment.TokenSpeedUnavailable as exc:
        pytest.skip(f"TokenSpeed not importable: {exc}")
    return Path(info.location).parent


@pytest.fixture(scope="session")
def tokenspeed_tree() -> Path:
    """The installed TokenSpeed's tree (its site-packages folder)."""
    if importlib.util.find_spec("tokenspeed") is None:
        pytest.skip("TokenSpeed not importable: No module named 'tokenspeed'")
    return installed_tree()


def tree_copy(tree: Path, target: Path, edits: dict[str, list[tuple[str, str]]]) -> Path:
    """A copy of ``tree``'s tokenspeed package under ``target`` with each file's
    (old, new) text replacements made (each old text must occur exactly once)."""
    shutil.copytree(tree / "tokenspeed", target / "tokenspeed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for relative, replacements in edits.items():
        path = target / "tokenspeed" / relative
        text = path.read_text()
        for old, new in replacements:
            assert text.count(old) == 1, f"{relative}: {old!r} occurs {text.count(old)} times"
            text = text.replace(old, new)
        path.write_text(text)
    return target


def run_command(tree: Path, out: Path, *variants: str) -> tuple[int, dict[str, Any]]:
    """``overlap-harness tokenspeed --tokenspeed-src TREE --json OUT`` in a child (TokenSpeed
    imports once per process); its exit status and JSON."""
    arguments = [sys.executable, "-m", "overlap_harness", "tokenspeed", "--tokenspeed-src",
                 str(tree), "--json", str(out)]
    for name in variants:
        arguments += ["--variant", name]
    done = subprocess.run(arguments, capture_output=True, text=True, timeout=600, check=False)
    document = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, document | {"stderr": done.stderr, "stdout": done.stdout}
