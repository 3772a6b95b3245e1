"""`.ci/run` runs exactly the README's commands: the Quick start's tests command (a fresh
virtual environment, the install, the tests), then the engine runs of the README's "CI"
section in that environment, and nothing else; the two test selections together are the one
selection CI ran before the engine runs were split off."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: what CI ran as one pytest command before the engine runs were split off: the two commands
#: together must select exactly it, so CI keeps every test it ran
DEFAULT_SELECTION = "not benchmark and (not slow or release_ci)"


def sh_blocks(section: str) -> list[str]:
    """The ``sh`` blocks of the README's section ``section``, in order."""
    text = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", text, flags=re.S)


def ci_commands() -> list[str]:
    return [line for line in (ROOT / ".ci/run").read_text().splitlines()
            if line and not line.startswith(("#", "set ", "cd "))]


def test_the_quick_start_is_two_commands_the_suite_and_the_tests() -> None:
    suite, tests = sh_blocks("Quick start")
    assert suite.endswith("&& overlap-harness run scenarios/")
    assert " -m pytest " in tests and "pip install" in tests


def test_ci_runs_the_readme_tests_command_then_its_engine_runs() -> None:
    _suite, tests = sh_blocks("Quick start")
    (engine_runs,) = sh_blocks("CI")
    assert ci_commands() == [tests, engine_runs]


def test_the_two_test_commands_split_the_default_selection() -> None:
    _suite, tests = sh_blocks("Quick start")
    (engine_runs,) = sh_blocks("CI")
    selections = [re.search(r"(?:^|&& )python3 -m pytest -q -n 2 -m '([^']*)'$", command)
                  for command in (tests, engine_runs)]
    assert all(selections), "each ends in one pytest run of one marker expression"
    assert [m.group(1) for m in selections] == [f"not engine_run and {DEFAULT_SELECTION}",
                                                f"engine_run and {DEFAULT_SELECTION}"]


def test_the_venv_is_fresh_and_isolated() -> None:
    """A new environment every run (``--clear``), never the machine's packages, and every
    later ``python3`` is the environment's (it is activated in the same line)."""
    for command in sh_blocks("Quick start"):
        assert "--clear" in command and "--system-site-packages" not in command
        target = re.search(r"-m venv --clear (\S+)", command)
        assert target and f". {target.group(1)}/bin/activate" in command
        assert (ROOT / ".gitignore").read_text().splitlines().count(f"{target.group(1)}/") == 1
