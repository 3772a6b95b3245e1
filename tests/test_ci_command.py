"""`.ci/run` runs exactly the README's commands: the Quick start's tests command (a fresh
virtual environment, the install, the tests), then the engine runs of the README's "CI"
section in that environment, and nothing else; the two test selections together are the one
selection CI ran before the engine runs were split off."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.release_ci_guard import REQUIRE_RELEASE_CI

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
    selections = [re.search(r"(?:^|&& )(?:[A-Z_]+=\S* )*python3 -m pytest -q -n 2 -m '([^']*)'$",
                            command)
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


def test_the_engine_runs_add_the_vllm_extra_and_let_no_release_test_skip() -> None:
    """CI's second step adds the ``vllm`` extra to the environment (the newest vLLM tree's
    tests need it), quietly about sglang's pins left unmet on purpose, and runs pytest with
    the guard on (a skipped ``release_ci`` test fails); the Quick start's command, what a
    newcomer runs, stays without either."""
    _suite, tests = sh_blocks("Quick start")
    (engine_runs,) = sh_blocks("CI")
    install, pytest_run = engine_runs.split(" && ")
    assert install == "python3 -m pip install -q --no-warn-conflicts -e '.[vllm]'"
    assert pytest_run.startswith(f"{REQUIRE_RELEASE_CI}=1 python3 -m pytest ")
    assert REQUIRE_RELEASE_CI not in tests and ".[vllm]" not in tests


def test_the_engine_runs_select_the_newest_vllm_release_of_the_matrix() -> None:
    """The engine-run selection collects the vLLM release matrix's tests of its CI release
    (and only those), and the module collects them without vLLM's packages installed (no
    module-level skip, which the guard could not see)."""
    (engine_runs,) = sh_blocks("CI")
    selection = re.search(r"-m '([^']*)'$", engine_runs).group(1)
    matrix = "tests/engines/vllm/test_release_matrix.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:xdist", "-m", selection, matrix], capture_output=True,
                          text=True, cwd=ROOT, check=False, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    items = sorted(line.split("::", 1)[1] for line in done.stdout.splitlines()
                   if line.startswith(f"{matrix}::"))
    assert items == ["test_each_release_is_driven_race_free_from_its_own_tree[vllm-0.34.0]",
                     "test_the_async_output_copys_entry_wait_removed_races_at_the_trees_lines",
                     "test_the_pull_request_view_names_the_removed_wait_on_0_34_trees",
                     "test_the_pytest_items_of_a_0_34_tree_leave_out_the_v1_runner",
                     "test_the_v1_runner_is_not_applicable_where_the_release_dropped_it"], \
        done.stdout[-2000:]
