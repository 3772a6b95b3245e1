"""Helpers for the plugin tests: run pytest in a folder of its own, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The package's pytest plugins (its ``pytest11`` entry points).
PLUGINS = ("overlap_harness.pytest_plugin", "overlap_harness.pytest_races")


def run_pytest_in(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest in ``folder`` (no cache; its own ini, none of this project's) and capture
    its output.

    The plugins come in through their entry points where the package is installed, and are
    named with ``-p`` where it is not (a bare checkout, as on the GPU machine). The checkout
    leads the path, so its code is what runs either way."""
    installed = {ep.value for ep in entry_points(group="pytest11")}
    named = [arg for plugin in PLUGINS if plugin not in installed for arg in ("-p", plugin)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *named,
                           *args], cwd=folder, capture_output=True, text=True, timeout=300,
                          check=False, env=env)
