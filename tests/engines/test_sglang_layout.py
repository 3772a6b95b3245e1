"""engines/sglang's folders keep their order: the loop driven at the top (cli, driver,
variants, configurations, ...), ``features/`` below it, ``stand_ins/`` at the bottom (what
stands in for SGLang's own code imports no feature and nothing above), ``report/`` and
``gpu/`` beside the top. Read from the modules' own imports (``if TYPE_CHECKING:`` imports,
which never run, left out)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "overlap_harness" / "engines" / "sglang"
PREFIX = "overlap_harness.engines.sglang"
#: the top: modules that drive the loop (a feature or stand-in importing one runs back up)
TOP = {"cli", "driver", "variants", "configurations", "coverage", "pr_side", "pytest_items"}


def _imports(path: Path) -> set[str]:
    """The package's modules ``path`` imports at run time (dotted, under the package)."""
    tree = ast.parse(path.read_text())
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
               for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            base = node.module.removeprefix(PREFIX).lstrip(".")
            found |= {f"{base}.{alias.name}".lstrip(".") if not base or base in
                      {"features", "stand_ins", "report", "gpu"} else base
                      for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.removeprefix(PREFIX).lstrip(".") for alias in node.names
                      if alias.name.startswith(PREFIX + ".")}
    return found


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _modules("stand_ins"), ids=lambda p: p.name)
def test_a_stand_in_imports_no_feature_and_nothing_above(path: Path) -> None:
    above = [name for name in _imports(path)
             if name.split(".")[0] in {"features", "report", "gpu"} | TOP]
    assert above == []


@pytest.mark.parametrize("path", _modules("features"), ids=lambda p: p.name)
def test_a_feature_imports_nothing_of_the_top_or_the_reports(path: Path) -> None:
    above = [name for name in _imports(path) if name.split(".")[0] in {"report", "gpu"} | TOP]
    assert above == []


def test_the_import_reader_sees_an_import_from_above() -> None:
    """The check above can fail: the driver's own imports name features and stand-ins."""
    imported = _imports(PACKAGE / "driver.py")
    assert any(name.startswith("stand_ins.") for name in imported)
    assert "variants" in imported
