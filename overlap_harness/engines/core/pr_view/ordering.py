"""Which lines of a Python file hold a stream-ordering operation.

The sync-site scan (:mod:`..sites`, :mod:`..helper_sites`) finds the statements the necessity
table removes: waits, event records and waits, synchronizes, queries, ``record_stream``,
non-blocking copies, keep-alive writes, calls of sync helpers. A pull request's changed lines
are checked for more than that, since a change to any of these reorders work just as well:
a stream switch (``torch.cuda.stream(s)``, ``set_stream``), a pinned allocation
(``pin_memory=True``, ``.pin_memory()``) and a CUDA graph's capture or replay
(``torch.cuda.graph(g)``, ``capture_begin``/``capture_end``, ``.replay()``). Every line a
statement spans counts (a ``with`` statement: its header lines only).
"""

from __future__ import annotations

import ast
from pathlib import Path

from overlap_harness.engines.core.helper_sites import scan_files
from overlap_harness.engines.core.sites import SiteKind

_STREAM_SWITCH = frozenset({"stream", "set_stream", "use_stream", "StreamContext"})
_GRAPH = frozenset({"graph", "CUDAGraph", "capture_begin", "capture_end", "replay"})


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _extra_kind(call: ast.Call) -> str | None:
    """The kind of a call the sync-site scan does not list, or None."""
    name = _call_name(call)
    if any(k.arg == "pin_memory" and not (isinstance(k.value, ast.Constant)
                                          and not k.value.value) for k in call.keywords):
        return "pinned_allocation"
    if name == "pin_memory":
        return "pinned_allocation"
    if name in _STREAM_SWITCH and (call.args or call.keywords):
        return "stream_switch"
    if name in _GRAPH:
        return "graph_capture" if name != "replay" else "graph_replay"
    return None


def _header_span(statement: ast.stmt) -> tuple[int, int]:
    """The lines a statement's own text spans (a compound statement: up to its body)."""
    last = statement.end_lineno or statement.lineno
    body = getattr(statement, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
        last = max(statement.lineno, body[0].lineno - 1)
    return statement.lineno, last


def _own_expressions(statement: ast.stmt) -> list[ast.AST]:
    """The expressions of a statement's own text (not of its nested statements)."""
    found: list[ast.AST] = []
    for _field, value in ast.iter_fields(statement):
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, ast.AST) and not isinstance(item, ast.stmt):
                found.append(item)
    return found


def ordering_lines(path: str | Path) -> dict[int, str]:
    """``{line: kind}`` for every line of ``path`` that a stream-ordering statement spans
    (empty for a file that does not parse)."""
    file = str(path)
    try:
        tree = ast.parse(Path(file).read_text(), file)
    except (OSError, SyntaxError, ValueError):
        return {}
    spans: dict[int, tuple[int, int]] = {}
    kinds: dict[int, str] = {}
    for statement in ast.walk(tree):
        if not isinstance(statement, ast.stmt) or isinstance(
                statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        spans[statement.lineno] = _header_span(statement)
        for expression in _own_expressions(statement):
            for call in (n for n in ast.walk(expression) if isinstance(n, ast.Call)):
                kind = _extra_kind(call)
                if kind is not None:
                    kinds.setdefault(statement.lineno, kind)
    for site in scan_files([file], frozenset(SiteKind)):
        kinds[site.line] = f"{site.kind} via {site.via}" if site.via else str(site.kind)
    lines: dict[int, str] = {}
    for first, kind in kinds.items():
        start, end = spans.get(first, (first, first))
        for line in range(start, end + 1):
            lines.setdefault(line, kind)
    return lines


def statement_lines(path: str | Path) -> list[int]:
    """The first line of every statement of ``path``, sorted (where a removed line's hunk is
    anchored: the nearest surviving statement)."""
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)})


def enclosing_functions(path: str | Path) -> list[tuple[int, int, str]]:
    """``(first, last, qualified name)`` of every function of ``path``, outermost first."""
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return found


def statement_starts(path: str | Path) -> dict[int, int]:
    """``{line: first line}`` for every line of a statement's own text, by the innermost
    statement (coverage reports a statement by its first line; a change to its third line is
    run when that first line is)."""
    try:
        tree = ast.parse(Path(path).read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return {}
    starts: dict[int, int] = {}
    for statement in ast.walk(tree):  # breadth first: inner statements come later, and win
        if isinstance(statement, ast.stmt):
            first, last = _header_span(statement)
            start = statement.lineno
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                # its header ran at import, before the measure began: a changed header
                # counts as run when the body's first statement runs
                body = [s for s in statement.body if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                start = body[0].lineno if body else statement.lineno
                if statement.decorator_list:
                    first = statement.decorator_list[0].lineno
            elif isinstance(statement, ast.ClassDef):
                first = last = statement.lineno
            for line in range(first, last + 1):
                starts[line] = start
    return starts
