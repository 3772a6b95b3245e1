"""The SGLang availability check tries the real import, and a failed import breaks nothing after it.

A package tree in tmp_path stands in for SGLang's layout (a regular top package whose
``__init__`` imports from a namespace subpackage, as ``sglang`` does): its import fails on a
missing dependency half-way, after ``pkg.ns`` and ``pkg.ns.good`` are loaded. The fixed twin
(:func:`import_failure`) reports the error and leaves the next import working; the plain
import leaves ``pkg.ns`` behind without ``pkg``, and the next import fails inside importlib.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from overlap_harness.conformance.sglang_env import import_failure, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def half_importable(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[str, Path]]:
    """A package ``NAME`` (unique per test) whose ``__init__`` loads ``NAME.ns.good`` and then
    needs ``NAME_dep``, which does not exist yet; yields (NAME, the folder for the dep)."""
    name = f"h1pkg_{request.node.name.split('[')[0].removeprefix('test_')}"
    (tmp_path / name / "ns").mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text(
        f"import {name}.ns.good\nimport {name}_dep\n")
    (tmp_path / name / "ns" / "good.py").write_text("VALUE = 1\n")
    (tmp_path / name / "ns" / "target.py").write_text("VALUE = 2\n")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        yield name, tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m.partition(".")[0] in (name, f"{name}_dep")]:
            del sys.modules[module]


def _add_dependency(name: str, folder: Path) -> None:
    (folder / f"{name}_dep.py").write_text("")
    importlib.invalidate_caches()


def test_failed_import_is_reported_and_the_retry_works(half_importable):
    name, folder = half_importable
    failure = import_failure(f"{name}.ns.target")
    assert failure == (f"import {name}.ns.target failed: ModuleNotFoundError: "
                       f"No module named '{name}_dep'")
    assert not [m for m in sys.modules if m.partition(".")[0] == name]
    _add_dependency(name, folder)
    assert import_failure(f"{name}.ns.target") is None
    assert sys.modules[f"{name}.ns.target"].VALUE == 2


def test_plain_failed_import_breaks_the_retry(half_importable):
    """The twin without the clean-up: what import_failure exists to prevent."""
    name, folder = half_importable
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{name}.ns.target")
    assert f"{name}.ns" in sys.modules and name not in sys.modules
    _add_dependency(name, folder)
    with pytest.raises(KeyError, match=name):
        importlib.import_module(f"{name}.ns.target")


def test_any_import_time_error_is_a_reason(tmp_path, monkeypatch):
    (tmp_path / "h1pkg_raises.py").write_text("raise RuntimeError('no device here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_failure("h1pkg_raises") == (
        "import h1pkg_raises failed: RuntimeError: no device here")
    assert "h1pkg_raises" not in sys.modules


_BLOCKED_THEN_RETRIED = textwrap.dedent("""
    import sys
    sys.modules["orjson"] = None  # as if the extra had not installed it
    from overlap_harness.conformance import sglang_env
    print("FIRST", sglang_env.unavailable_reason())
    del sys.modules["orjson"]
    sglang_env.unavailable_reason.cache_clear()
    print("SECOND", sglang_env.unavailable_reason())
    print("LOADED", sglang_env.load_overlap_utils().__name__)
""")


@pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")
@pytest.mark.engine_run
def test_real_sglang_check_names_the_missing_package_and_recovers():
    """SGLang itself, in a fresh process: a package its import needs is blocked, the check
    names it; unblocked, the same process imports SGLang (no ``KeyError: 'sglang'``)."""
    result = subprocess.run([sys.executable, "-c", _BLOCKED_THEN_RETRIED], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines()
                 if line.startswith(("FIRST", "SECOND", "LOADED")))
    assert lines["FIRST"].startswith("import sglang.srt.managers.overlap_utils failed: ")
    assert "orjson" in lines["FIRST"] and "pip install" in lines["FIRST"]
    assert lines["SECOND"] == "None"
    assert lines["LOADED"] == "sglang.srt.managers.overlap_utils"
