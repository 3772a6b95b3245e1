"""`.ci/run` runs exactly the README's commands: a fresh virtual environment, the install, the
tests and the engine runs in it, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_blocks() -> list[str]:
    """The ``sh`` blocks of the README's "Quick start" section, in order."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", quick, flags=re.S)


def test_ci_runs_the_readme_commands_in_a_fresh_venv() -> None:
    blocks = quick_start_blocks()
    assert " -m venv " in blocks[0] and "pip install" in blocks[1]
    commands = [line for line in (ROOT / ".ci/run").read_text().splitlines()
                if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == blocks


#: what CI ran as one pytest command before the engine runs were split off: the two commands
#: together must select exactly it, so CI keeps every test it ran
DEFAULT_SELECTION = "not benchmark and (not slow or release_ci)"


def test_the_two_test_commands_split_the_default_selection() -> None:
    selections = [re.fullmatch(r"python3 -m pytest -q -n 2 -m '(.*)'", block)
                  for block in quick_start_blocks() if "pytest" in block]
    assert all(selections), "each test command is one pytest run, nothing chained"
    assert [m.group(1) for m in selections] == [f"not engine_run and {DEFAULT_SELECTION}",
                                                f"engine_run and {DEFAULT_SELECTION}"]


def test_the_venv_is_fresh_and_isolated() -> None:
    """A new environment every run (``--clear``), never the machine's packages, and every
    later ``python3`` is the environment's (it is activated in the same line)."""
    (venv_command,) = [b for b in quick_start_blocks() if " -m venv " in b]
    assert "--clear" in venv_command and "--system-site-packages" not in venv_command
    target = re.search(r"-m venv --clear (\S+)", venv_command)
    assert target and f". {target.group(1)}/bin/activate" in venv_command
    assert (ROOT / ".gitignore").read_text().splitlines().count(f"{target.group(1)}/") == 1
