"""Remove one sync site from live code: recompile its function with the statement gone.

The function is recompiled from its own file, parsed whole, so every line keeps its number and
the code object keeps the file's name: a race the mutation causes points at the engine's own
lines. The removed statement becomes a call that counts how often the site was reached (the
site's coverage: a site never reached cannot be judged); a keep-alive ring write leaves its
slot an empty list (nothing kept alive, the slot still there for later appends). The new
function replaces the old one wherever the old one is bound (its class, or its module and every
module that imported it).
Meant for a forked child; :func:`remove_site` returns what puts the old function back (the
GPU table runs a race row's twin trials on the unmodified code in the same child).

Beside it, for code that must stay in one process: :func:`removed` swaps one function of a
live class or module for its mutant inside a block and restores it after (:func:`site` finds
the statement by its text, :func:`mutant` builds the function: the statement replaced by
``pass``, free variables such as ``super()``'s class cell kept); and
:func:`function_from_file` takes one function from another version of the engine's file (a
release before a fix), compiled alone with that file's name and lines in the installed
module's globals.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from overlap_harness.engines.core.sites import SiteKind, SyncSite
from overlap_harness.model.errors import HarnessError

REACHED_HOOK = "__overlap_harness_site_reached__"
_TEMP_CLASS = "__overlap_harness_mutated_class__"
T = TypeVar("T")


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
                    replacement: list[ast.stmt] = [hook]
                    if site.kind == SiteKind.KEEP_ALIVE and isinstance(statement, ast.Assign):
                        # the ring slot stays, empty: what the write kept alive is no longer
                        # held, and code that appends to the slot later (SGLang's worker
                        # keep-alive refs) still finds a list
                        replacement.append(ast.Assign(statement.targets,
                                                      ast.List([], ast.Load())))
                    for new in replacement:
                        ast.copy_location(new, statement)
                        ast.fix_missing_locations(new)
                    block[index:index + 1] = replacement
                    return
    raise MutationError(f"{site.key}: no statement at that line in {site.function}")


def remove_site(site: SyncSite, coverage: Coverage) -> Callable[[], None]:
    """Recompile the function holding ``site`` without it, and bind it where the old one was;
    returns a call that binds the old one back (the same object, wherever it was bound)."""
    undo: list[Callable[[], None]] = []
    recompile(site, coverage, lambda function: _remove_statement(function, site), undo)
    return undo[0]


def parsed(file: str) -> ast.Module:
    """The syntax tree of ``file`` as it is on disk now, parsed once per process while the
    file is unchanged (its size and modification time): the necessity table parses its
    sites' files in the parent, and each forked child finds them parsed (SGLang's
    scheduler.py: 5,000 lines, once per child and per probed function before). Read it,
    never change it: :func:`recompile` edits a copy of the one function it needs.

    Raises:
        OSError: the file cannot be read.
        SyntaxError: it does not parse.
    """
    status = os.stat(file)
    return _parsed(file, status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _parsed(file: str, size: int, modified_ns: int) -> ast.Module:
    with open(file) as source:
        return ast.parse(source.read(), file)


def recompile(site: SyncSite, coverage: Coverage, edit: Callable[[ast.AST], T],
              undo: list[Callable[[], None]] | None = None) -> T:
    """Recompile the function holding ``site`` from its file after ``edit`` changed its tree
    (its calls of the reached hook count into ``coverage``), and bind it where the old one
    was; returns what ``edit`` returned. With ``undo``, a call that binds the old function
    back is appended to it."""
    module = _module_of(site.file)
    classes, function = _find(parsed(site.file), site)
    function = copy.deepcopy(function)  # the parsed file stays as it is on disk
    edited = edit(function)
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
        if undo is not None:
            undo.append(functools.partial(setattr, owner, function.name, old))
    else:
        new = namespace[function.name]
        _rebind(old, new)
        if undo is not None:
            undo.append(functools.partial(_rebind, new, old))
    return edited


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


@dataclass(frozen=True, slots=True)
class Site:
    """A statement of an engine's source: ``owner.attribute`` defines the function that holds
    ``line`` of ``file``; ``code`` is that line's text, stripped."""

    owner: Any
    attribute: str
    file: str
    line: int
    code: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _unwrapped(owner: Any, attribute: str) -> Any:
    raw = inspect.getattr_static(owner, attribute)
    if isinstance(raw, staticmethod | classmethod):
        raw = raw.__func__
    return inspect.unwrap(raw)


def site(owner: Any, attribute: str, needle: str, occurrence: int = 1) -> Site:
    """The ``occurrence``-th line of ``owner.attribute`` whose text contains ``needle``."""
    function = _unwrapped(owner, attribute)
    lines, start = inspect.getsourcelines(function)
    seen = 0
    for offset, text in enumerate(lines):
        if needle in text:
            seen += 1
            if seen == occurrence:
                return Site(owner, attribute, inspect.getsourcefile(function) or "",
                            start + offset, text.strip())
    raise MutationError(f"{getattr(owner, '__qualname__', owner)}.{attribute}: no line "
                        f"containing {needle!r} (the engine's source changed)")


class _RemoveLine(ast.NodeTransformer):
    def __init__(self, line: int) -> None:
        self.line = line
        self.removed = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field_name in ("body", "orelse", "finalbody"):
            body = getattr(node, field_name, None)
            if isinstance(body, list):
                for index, statement in enumerate(body):
                    if isinstance(statement, ast.stmt) and statement.lineno == self.line:
                        body[index] = ast.copy_location(ast.Pass(), statement)
                        self.removed += 1
        return super().generic_visit(node)


def _definition(source_file: str, function: Any) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(Path(source_file).read_text(), filename=source_file)
    first = function.__code__.co_firstlineno
    for node in ast.walk(tree):
        if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and node.name == function.__name__
                and min([node.lineno, *(d.lineno for d in node.decorator_list)]) == first):
            return node
    raise MutationError(f"{source_file}: no definition of {function.__name__} at line {first}")


def mutant(target: Site, *more: Site) -> Any:
    """The function of ``target`` (as stored on its owner: decorators applied) with the
    statement on ``target.line`` replaced by ``pass`` (and those of ``more``: other lines of
    the same function)."""
    function = _unwrapped(target.owner, target.attribute)
    node = _definition(target.file, function)
    for each in (target, *more):
        if (each.owner, each.attribute, each.file) != (target.owner, target.attribute,
                                                       target.file):
            raise MutationError(f"{each.where}: not in the function of {target.where}")
        remover = _RemoveLine(each.line)
        remover.visit(node)
        if remover.removed != 1:
            raise MutationError(f"{each.where}: no statement starts on this line")
    free = function.__code__.co_freevars
    factory = ast.FunctionDef(
        name="__overlap_factory", args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg=name) for name in free], kwonlyargs=[],
            kw_defaults=[], defaults=[]),
        body=[node, ast.Return(value=ast.Name(id=node.name, ctx=ast.Load()))],
        decorator_list=[], returns=None, type_params=[])
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)  # the factory's own nodes get line 1
    code = compile(module, target.file, "exec")
    scope: dict[str, Any] = {}
    exec(code, function.__globals__, scope)
    cells = [cell.cell_contents for cell in function.__closure__ or ()]
    return scope["__overlap_factory"](*cells)


@contextmanager
def removed(target: Site, *more: Site) -> Iterator[Any]:
    """Inside the block ``target.owner.attribute`` is the mutant (``target``'s statement,
    and those of ``more`` in the same function, removed together); restored after."""
    replacement = mutant(target, *more)
    raw = inspect.getattr_static(target.owner, target.attribute)
    if isinstance(raw, staticmethod):
        replacement = staticmethod(replacement)
    elif isinstance(raw, classmethod):
        replacement = classmethod(replacement)
    setattr(target.owner, target.attribute, replacement)
    try:
        yield replacement
    finally:
        setattr(target.owner, target.attribute, raw)


def function_from_file(source_file: str | Path, class_name: str | None, name: str,
                       module_globals: dict[str, Any]) -> Any:
    """The function ``class_name.name`` (or module-level ``name``) as defined in
    ``source_file``, compiled alone with that file's name and line numbers and run in
    ``module_globals`` (the installed module's, so its imports resolve). Decorators are
    applied; a zero-argument ``super()`` is not supported (no class cell).

    Raises:
        MutationError: the file has no such definition.
    """
    source_file = str(source_file)
    tree = ast.parse(Path(source_file).read_text(), filename=source_file)
    scope: list[ast.stmt] = tree.body
    if class_name is not None:
        classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not classes:
            raise MutationError(f"{source_file}: no class {class_name}")
        scope = classes[0].body
    found = [n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
             and n.name == name]
    if not found:
        raise MutationError(f"{source_file}: no function {class_name or ''}.{name}")
    module = ast.Module(body=[found[-1]], type_ignores=[])
    code = compile(module, source_file, "exec")
    local: dict[str, Any] = {}
    exec(code, module_globals, local)
    return local[name]
