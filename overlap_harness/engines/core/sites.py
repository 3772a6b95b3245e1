"""Find the stream/event sync sites of a source file by reading its AST.

A sync site is one statement that orders streams or the host against them, or keeps memory
alive across streams: ``wait_stream``, ``wait_event``, an event's ``record``/``wait``/
``synchronize``/``query``, a stream's ``synchronize``, ``record_stream``, a ``non_blocking``
copy (``.to(..., non_blocking=True)``, ``copy_(..., non_blocking=True)``) and a write into a
keep-alive ring (an assignment to a subscript of a ``*record_buf*``/``*keep_alive*`` name).
Sites are found, not listed: the scan runs over the files as they are, so a PR that adds or
moves a sync gets its own rows. Each site names the function it sits in, so a mutation can
recompile that one function without it (:mod:`.mutation`).
"""

from __future__ import annotations

import ast
import functools
import inspect
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class SiteKind(StrEnum):
    """What a sync site does."""

    WAIT_STREAM = "wait_stream"
    WAIT_EVENT = "wait_event"
    EVENT_RECORD = "event.record"
    EVENT_WAIT = "event.wait"
    SYNCHRONIZE = "synchronize"
    QUERY = "query"
    RECORD_STREAM = "record_stream"
    NON_BLOCKING_COPY = "non_blocking_copy"
    KEEP_ALIVE = "keep_alive"


_METHODS = {"wait_stream": SiteKind.WAIT_STREAM, "wait_event": SiteKind.WAIT_EVENT,
            "record": SiteKind.EVENT_RECORD, "wait": SiteKind.EVENT_WAIT,
            "synchronize": SiteKind.SYNCHRONIZE, "query": SiteKind.QUERY,
            "record_stream": SiteKind.RECORD_STREAM}
_KEEP_ALIVE_NAMES = ("record_buf", "keep_alive")


@dataclass(frozen=True, slots=True)
class SyncSite:
    """One sync statement: its file and line, the enclosing function's qualified name and
    first line, what kind of sync, the statement's source text, and for the call of a sync
    helper the helper it calls."""

    file: str
    line: int
    function: str
    function_line: int
    kind: SiteKind
    code: str
    via: str = ""  # a call of a sync helper: the helper's qualified name (:mod:`.helper_sites`)

    @property
    def key(self) -> str:
        """``file:line`` with the file's name only (how tables and tests name a site)."""
        return f"{Path(self.file).name}:{self.line}"


def _call_kind(call: ast.Call) -> SiteKind | None:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    non_blocking = any(k.arg == "non_blocking" and not (
        isinstance(k.value, ast.Constant) and k.value.value is False) for k in call.keywords)
    if func.attr in ("to", "copy_", "cuda") and non_blocking:
        return SiteKind.NON_BLOCKING_COPY
    kind = _METHODS.get(func.attr)
    if kind in (SiteKind.EVENT_RECORD, SiteKind.EVENT_WAIT, SiteKind.QUERY):
        # ``x.record(...)``/``x.wait()``/``x.query()`` on something named like an event or
        # stream (``ev``, ``copy_done``, ``publish_ready``): not a logger's or a queue's
        target = ast.unparse(func.value).lower()
        if not any(w in target for w in ("event", "done", "ready", "ev", "stream", "fence")):
            return None
    return kind


def _keep_alive(statement: ast.stmt) -> bool:
    if not isinstance(statement, ast.Assign):
        return False
    return any(isinstance(t, ast.Subscript)
               and any(n in ast.unparse(t.value) for n in _KEEP_ALIVE_NAMES)
               for t in statement.targets)


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, lines: list[str]) -> None:
        self.file = file
        self.lines = lines
        self.scope: list[ast.AST] = []
        self.sites: list[SyncSite] = []

    def _enter(self, node: ast.AST) -> None:
        self.scope.append(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _enter

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt) and not isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self._statement(node)
        super().generic_visit(node)

    def _statement(self, statement: ast.stmt) -> None:
        functions = [n for n in self.scope if isinstance(n, ast.FunctionDef
                                                         | ast.AsyncFunctionDef)]
        if not functions:
            return  # module level: not on a loop's path
        kind: SiteKind | None = SiteKind.KEEP_ALIVE if _keep_alive(statement) else None
        if kind is None and isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign
                                       | ast.Return) and statement.value is not None:
            calls = [n for n in ast.walk(statement.value) if isinstance(n, ast.Call)]
            kinds = [k for k in map(_call_kind, calls) if k is not None]
            kind = kinds[0] if kinds else None
        if kind is None:
            return
        outer = functions[0]
        qualname = ".".join(n.name for n in self.scope  # type: ignore[attr-defined]
                            if isinstance(n, ast.ClassDef | ast.FunctionDef
                                          | ast.AsyncFunctionDef))
        code = " ".join(self.lines[statement.lineno - 1:statement.end_lineno or
                                   statement.lineno]).split()
        self.sites.append(SyncSite(self.file, statement.lineno, qualname, outer.lineno, kind,
                                   " ".join(code)))


def scan(path: str | Path) -> list[SyncSite]:
    """Every sync site of the Python file ``path`` inside a function, in line order."""
    file = Path(path)
    return list(_scan_file(str(path), file.stat().st_mtime_ns))


@functools.lru_cache(maxsize=64)
def _scan_file(path: str, _mtime_ns: int) -> tuple[SyncSite, ...]:
    """The scan of one file as it is now (the modification time keys the cache: an adapter
    asks for a large file once per driven function)."""
    text = Path(path).read_text()
    scanner = _Scanner(path, text.splitlines())
    scanner.visit(ast.parse(text, path))
    return tuple(sorted(scanner.sites, key=lambda s: s.line))


def function_sites(owner: object, attribute: str) -> list[SyncSite]:
    """The sync sites of one live function, ``owner.attribute`` (a method of a class, or a
    function of a module), as :func:`scan` finds them in its file: an adapter that drives a
    few functions of a large file names them instead of the whole file."""
    raw = inspect.getattr_static(owner, attribute)
    if isinstance(raw, staticmethod | classmethod):
        raw = raw.__func__
    function = inspect.unwrap(raw)
    lines, first = inspect.getsourcelines(function)
    file = inspect.getsourcefile(function) or ""
    last = first + len(lines) - 1
    return [s for s in scan(file) if first <= s.line <= last]
