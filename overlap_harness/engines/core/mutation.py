"""Remove one sync site from live code: recompile its function with the statement gone.

The function is recompiled from its own file, parsed whole, so every line keeps its number and
the code object keeps the file's name: a race the mutation causes points at the engine's own
lines. The removed statement becomes a call that counts how often the site was reached (the
site's coverage: a site never reached cannot be judged). The new function replaces the old one
wherever the old one is bound (its class, or its module and every module that imported it).
Meant for a forked child: nothing is restored.
"""

from __future__ import annotations

import ast
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.engines.core.sites import SyncSite
from overlap_harness.model.errors import HarnessError

REACHED_HOOK = "__overlap_harness_site_reached__"
_TEMP_CLASS = "__overlap_harness_mutated_class__"


class MutationError(HarnessError):
    """The site's function cannot be found or recompiled in the code as loaded."""


@dataclass
class Coverage:
    """How many times each removed site's statement was reached."""

    reached: dict[str, int] = field(default_factory=dict)

    def __call__(self, key: str) -> None:
        self.reached[key] = self.reached.get(key, 0) + 1


def _module_of(path: str) -> types.ModuleType:
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == path:
            return module
    raise MutationError(f"{path}: not imported in this process")


def _find(tree: ast.Module, site: SyncSite) -> tuple[list[str], ast.FunctionDef]:
    """The classes enclosing the site's outermost function, and that function."""
    names = site.function.split(".")
    body: list[ast.stmt] = tree.body
    classes: list[str] = []
    for name in names:
        node = next((n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef
                                                   | ast.AsyncFunctionDef) and n.name == name),
                    None)
        if node is None:
            break
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return classes, node  # type: ignore[return-value]
        classes.append(name)
        body = node.body
    raise MutationError(f"{site.key}: function {site.function} not found")


def _remove_statement(function: ast.AST, site: SyncSite) -> None:
    for node in ast.walk(function):
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field_name, None)
            if not isinstance(block, list):
                continue
            for index, statement in enumerate(block):
                if isinstance(statement, ast.stmt) and statement.lineno == site.line:
                    hook = ast.Expr(ast.Call(ast.Name(REACHED_HOOK, ast.Load()),
                                             [ast.Constant(site.key)], []))
                    block[index] = ast.copy_location(hook, statement)
                    ast.fix_missing_locations(block[index])
                    return
    raise MutationError(f"{site.key}: no statement at that line in {site.function}")


def remove_site(site: SyncSite, coverage: Coverage) -> None:
    """Recompile the function holding ``site`` without it, and bind it where the old one was."""
    module = _module_of(site.file)
    with open(site.file) as source:
        tree = ast.parse(source.read(), site.file)
    classes, function = _find(tree, site)
    _remove_statement(function, site)
    module.__dict__[REACHED_HOOK] = coverage
    if classes:
        holder = ast.ClassDef(_TEMP_CLASS, [], [], [function], [])  # name mangling as in
        new_tree = ast.Module([ast.copy_location(holder, function)], [])  # the real class
    else:
        new_tree = ast.Module([function], [])
    ast.fix_missing_locations(new_tree)
    namespace = module.__dict__
    old = _resolve(module, classes, function.name)
    exec(compile(new_tree, site.file, "exec"), namespace)
    if classes:
        new = namespace.pop(_TEMP_CLASS).__dict__[function.name]
        owner: Any = module
        for name in classes:
            owner = getattr(owner, name)
        setattr(owner, function.name, new)
    else:
        new = namespace[function.name]
        _rebind(old, new)


def _resolve(module: types.ModuleType, classes: list[str], name: str) -> Any:
    owner: Any = module
    for cls in classes:
        owner = getattr(owner, cls)
    return owner.__dict__[name] if hasattr(owner, "__dict__") else getattr(owner, name)


def _rebind(old: Any, new: Any) -> None:
    """Every module global bound to ``old`` (``from x import f`` copies) now names ``new``."""
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for key, value in list(namespace.items()):
            if value is old:
                namespace[key] = new
