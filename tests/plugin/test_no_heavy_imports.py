"""A pytest session that asks nothing of ours imports nothing heavy: the package's pytest11
plugins (scenarios, the ``stream_races`` marker, the SGLang and vLLM items) are loaded into
every pytest run of an environment that has the package, so torch, SGLang, vLLM, simpy and
numba must wait until an option or marker of ours is used. The probe is the user project's
own conftest, which lists the heavy modules present when the session ends; a marked test in a
second run shows the probe sees torch once the marker asks for it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.plugin.conftest import run_pytest_in

#: The engines' item plugins (run_pytest_in names the others where they are not installed;
#: these are entry points named by their module, so ``-p`` with that name is the same plugin).
ENGINE_PLUGINS = ("overlap_harness.engines.sglang.pytest_items",
                  "overlap_harness.engines.vllm.pytest_items")

HEAVY = ("torch", "sglang", "vllm", "simpy", "numba", "matplotlib", "networkx")

PROBE = textwrap.dedent(f"""\
    import json
    import sys

    def pytest_sessionfinish(session):
        heavy = [name for name in {HEAVY!r} if name in sys.modules]
        with open("heavy_modules.json", "w") as out:
            json.dump(heavy, out)
    """)

PLAIN_TEST = "def test_app():\n    assert 1 + 1 == 2\n"

MARKED_TEST = textwrap.dedent("""\
    import pytest

    @pytest.mark.stream_races(mode="cpu")
    def test_marked():
        assert 1 + 1 == 2
    """)


def _heavy_after(folder: Path, test_source: str) -> list[str]:
    (folder / "conftest.py").write_text(PROBE)
    (folder / "test_app.py").write_text(test_source)
    plugins = [arg for plugin in ENGINE_PLUGINS for arg in ("-p", plugin)]
    result = run_pytest_in(folder, *plugins, "-q")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout
    return json.loads((folder / "heavy_modules.json").read_text())


def test_a_session_that_asks_nothing_imports_nothing_heavy(tmp_path: Path) -> None:
    assert _heavy_after(tmp_path, PLAIN_TEST) == []


def test_the_marker_imports_torch_when_a_marked_test_runs(tmp_path: Path) -> None:
    assert "torch" in _heavy_after(tmp_path, MARKED_TEST)
