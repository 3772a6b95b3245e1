"""The import graph has no upward arrow and no circle (docs/ARCHITECTURE.md, issue 14).

Layers, lowest first: ``model`` (the device API, the detector, the protocol, results) imports
no other part; ``scenarios`` (the loader) and ``reports`` (readers of result records) import
only ``model``; the devices ``sim``, ``gpu_check`` and ``recorder`` import only ``model`` (never
each other, never anything above); everything else in ``overlap_harness`` (the runner, the CLI,
the replay and conformance packages) sits on top. Imports are read from the source (``ast``),
function-local ones included, so a deferred import cannot hide an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "overlap_harness"
FOLDERS = {"model": "model", "sim": "sim", "gpu_check": "gpu_check", "recorder": "recorder",
           "scenarios": "scenarios", "reports": "reports"}
ALLOWED = {  # part -> the parts it may import (besides itself)
    "model": set(),
    "scenarios": {"model"},
    "reports": {"model"},
    "sim": {"model"},
    "gpu_check": {"model"},
    "recorder": {"model"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for part, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            name = ".".join([PACKAGE, part, *[p for p in rel.parts if p != "__init__"]])
            found[name] = path
    for path in (ROOT / PACKAGE).rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        found[".".join(p for p in rel.parts if p != "__init__")] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The modules ``name`` imports: ``from pkg import submodule`` names the submodule, not
    the package (it does not read the package's own names)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}  # never run: no arrow
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{a.name}" for a in node.names} & set(modules)
            out |= submodules
            if len(submodules) < len(node.names):
                out.add(base)
    return {m for m in out if m.startswith(PACKAGE + ".") or m == PACKAGE}


def _part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[1] in FOLDERS else "top"


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(path, name, modules):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]  # `from pkg.mod import name`
            if target in modules and target != name:
                graph.add_edge(name, target)
    return graph


def test_no_part_imports_upward_or_sideways() -> None:
    wrong = sorted(f"{a} -> {b}" for a, b in _graph().edges
                   if _part(a) in ALLOWED and _part(b) != _part(a)
                   and _part(b) not in ALLOWED[_part(a)])
    assert not wrong, "\n".join(wrong)


def test_the_modules_import_no_circle() -> None:
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, cycles[:3]


def test_no_generic_top_level_package_is_installed() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = text.split("packages = [", 1)[1].split("]", 1)[0]
    names = [n.strip().strip('"') for n in block.split(",") if n.strip()]
    assert names and all(n == PACKAGE or n.startswith(PACKAGE + ".") for n in names), names


def test_the_engine_core_imports_no_engine_adapter() -> None:
    """engines/core is engine-neutral: an adapter imports it, never the reverse (a third
    engine is one more adapter beside it)."""
    core = f"{PACKAGE}.engines.core"
    adapters = {m.split(".")[2] for m in _modules() if m.startswith(f"{PACKAGE}.engines.")
                and m.count(".") >= 3 and m.split(".")[2] != "core"}
    assert {"sglang", "vllm"} <= adapters
    wrong = sorted(f"{a} -> {b}" for a, b in _graph().edges
                   if a.startswith(core) and b.startswith(f"{PACKAGE}.engines.")
                   and not b.startswith(core) and b != f"{PACKAGE}.engines")
    assert not wrong, "\n".join(wrong)
