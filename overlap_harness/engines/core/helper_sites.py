"""Sync sites hidden in small helpers: the call of a function whose body is only syncs.

A scan of statements (:mod:`.sites`) finds ``t.record_stream(stream)`` inside a helper such as
``record_stream_each(tensors, stream)``, but not the callers, where the sync is decided: a
statement ``record_stream_each((a, b), stream)`` orders nothing by its own text. The rule here,
one level deep:

* a **sync helper** is a function defined in one of the scanned files whose body does nothing
  but sync: every simple statement in it (through ``for``/``if``/``while``/``with``/``try``)
  is a removable sync site of the scan, a docstring, ``pass``, ``continue``, ``break`` or a bare
  ``return``, and there is at least one sync. A function that also computes, copies, stores or
  returns something is not one (removing its call would remove data, not only an ordering);
* a **helper call site** is an expression statement, in a function of a scanned file, whose
  value is a call of a sync helper: by its bare name in the helper's own file or in a file that
  imports it by name (``from ... import helper``), or as ``self.helper(...)`` inside the class
  that defines it. It is a site of the helper's kind, ``via`` the helper; removing the call
  statement removes exactly the syncs that call makes.

The helper's own statements stay sites too (removing one removes it for every caller). A
helper of helpers is not followed (one level): its calls of a sync helper are sites, so its
whole effect is still removable there.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from overlap_harness.engines.core.sites import SiteKind, SyncSite, scan

_HARMLESS = (ast.Pass, ast.Continue, ast.Break)
_COMPOUND = (ast.For, ast.AsyncFor, ast.If, ast.While, ast.With, ast.AsyncWith, ast.Try)


@dataclass(frozen=True, slots=True)
class SyncHelper:
    """A function whose body is only syncs: where it is, its name, its kind of sync."""

    file: str
    qualname: str  # "record_stream_each" or "Class.method"
    kind: SiteKind

    @property
    def name(self) -> str:
        """The name it is called by."""
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def owner(self) -> str | None:
        """The class that defines it (a method), or None (a module function)."""
        return self.qualname.rsplit(".", 1)[0] if "." in self.qualname else None


def _simple_statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """The simple statements of ``body``, through compound statements (not nested defs)."""
    for statement in body:
        if isinstance(statement, _COMPOUND):
            for field in ("body", "orelse", "finalbody"):
                yield from _simple_statements(getattr(statement, field, []) or [])
            for handler in getattr(statement, "handlers", []):
                yield from _simple_statements(handler.body)
        elif not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef
                            | ast.ClassDef):
            yield statement


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
        and isinstance(statement.value.value, str)


def _helper(function: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, file: str,
            sites_by_line: dict[int, SyncSite], mutable: frozenset[SiteKind]
            ) -> SyncHelper | None:
    kinds = []
    for statement in _simple_statements(function.body):
        site = sites_by_line.get(statement.lineno)
        if site is not None and site.kind in mutable:
            kinds.append(site.kind)
        elif not (_is_docstring(statement) or isinstance(statement, _HARMLESS)
                  or (isinstance(statement, ast.Return) and statement.value is None)):
            return None
    return SyncHelper(file, qualname, kinds[0]) if kinds else None


def _definitions(tree: ast.Module) -> Iterable[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module functions and methods of module classes, with their qualified names."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def _parse(file: str) -> ast.Module:
    return ast.parse(Path(file).read_text(), file)


def sync_helpers(files: Sequence[str], mutable: frozenset[SiteKind]) -> list[SyncHelper]:
    """The sync helpers defined in ``files`` (see the module docstring)."""
    helpers = []
    for file in files:
        sites = {s.line: s for s in scan(file)}
        for qualname, function in _definitions(_parse(file)):
            helper = _helper(function, qualname, file, sites, mutable)
            if helper is not None:
                helpers.append(helper)
    return helpers


def _imported_names(tree: ast.Module) -> set[str]:
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def _called(statement: ast.stmt, helpers: dict[str, list[SyncHelper]], file: str,
            imported: set[str], scope_classes: list[str]) -> SyncHelper | None:
    """The helper the expression statement calls, if it is one this file can reach."""
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return None
    func = statement.value.func
    if isinstance(func, ast.Name):
        for helper in helpers.get(func.id, []):
            if helper.owner is None and (helper.file == file or func.id in imported):
                return helper
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
            and func.value.id == "self":
        for helper in helpers.get(func.attr, []):
            if helper.file == file and helper.owner in scope_classes:
                return helper
    return None


def helper_call_sites(files: Sequence[str], helpers: Sequence[SyncHelper]) -> list[SyncSite]:
    """Every expression statement in a function of ``files`` that calls one of ``helpers``."""
    by_name: dict[str, list[SyncHelper]] = {}
    for helper in helpers:
        by_name.setdefault(helper.name, []).append(helper)
    found = []
    for file in files:
        tree = _parse(file)
        lines = Path(file).read_text().splitlines()
        imported = _imported_names(tree)
        for qualname, function in _definitions(tree):
            classes = qualname.split(".")[:-1]
            for statement in _simple_statements(function.body):
                helper = _called(statement, by_name, file, imported, classes)
                if helper is None or (helper.file == file and helper.qualname == qualname):
                    continue
                code = " ".join(" ".join(
                    lines[statement.lineno - 1:statement.end_lineno or statement.lineno]).split())
                found.append(SyncSite(file, statement.lineno, qualname, function.lineno,
                                      helper.kind, code, via=helper.qualname))
    return found


def scan_files(files: Sequence[str], mutable: frozenset[SiteKind]) -> list[SyncSite]:
    """The sites of ``files`` (:func:`.sites.scan`) and their helper call sites, in file then
    line order; ``mutable`` are the kinds a removal removes (a helper is made of them)."""
    helpers = sync_helpers(files, mutable)
    calls = helper_call_sites(files, helpers)
    order = {file: index for index, file in enumerate(files)}
    sites = [site for file in files for site in scan(file)] + calls
    return sorted(sites, key=lambda s: (order[s.file], s.line))
