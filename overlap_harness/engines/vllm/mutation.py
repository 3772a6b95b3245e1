"""Remove one statement from an engine's function by recompiling that function alone, with
its own file name and line numbers, so races found in the mutant point at the engine's lines;
and take one function from another version of the engine's file (the version before a fix)
the same way (:func:`function_from_file`).

Engine-neutral (nothing here knows vLLM): the shared core's mutation, written beside the vLLM
adapter until the two cores are merged. The function's source is read from its file, the
statement on the given line is replaced by ``pass`` in the AST (line numbers kept), and the
definition is compiled and run in the function's own module globals. Free variables (a
``super()`` call's ``__class__``) are given the original cells' values through a factory.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlap_harness.model.errors import HarnessError


class MutationError(HarnessError):
    """The statement to remove is not where the mutation says (the tree changed)."""


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


def mutant(target: Site) -> Any:
    """The function of ``target`` (as stored on its owner: decorators applied) with the
    statement on ``target.line`` replaced by ``pass``."""
    function = _unwrapped(target.owner, target.attribute)
    node = _definition(target.file, function)
    remover = _RemoveLine(target.line)
    remover.visit(node)
    if remover.removed != 1:
        raise MutationError(f"{target.where}: no statement starts on this line")
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
def removed(target: Site) -> Iterator[Any]:
    """Inside the block ``target.owner.attribute`` is the mutant; restored after."""
    replacement = mutant(target)
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
