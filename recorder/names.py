"""Names: what the user's code calls a tensor, stream or event the recorder sees being made.

A thing is named after the variable its statement assigns it to: ``buf = torch.zeros(4)``
names ``buf``; tuple targets name each part, either by position in a tuple of values
(``s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()`` names the first stream ``s1``) or, for
an op returning several tensors, by output (``values, order = x.sort()``). Which call of the
statement is running comes from the frame's current instruction and its source position
(``code.co_positions()``, PEP 657), matched against the statement's syntax tree, so
statements spanning lines and several calls on one line are named right.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType

from overlap_harness.recorder.sites import SourceBusy, display_path, source_tree, user_frame

Position = tuple[int, int, int, int]  # line, end line, column, end column


@dataclass(frozen=True, slots=True)
class Targets:
    """What the running call's statement assigns to.

    ``names`` has one entry per target of the statement (None where a target is not a plain
    variable or attribute); ``part`` is the target the running call's value goes to when the
    statement assigns a tuple of values, None when the whole value goes to ``names``.
    """

    names: tuple[str | None, ...]
    part: int | None = None

    def single(self) -> str | None:
        """The one variable the running call's value is assigned to, if there is one."""
        if self.part is not None:
            return self.names[self.part]
        return self.names[0] if len(self.names) == 1 else None

    def output(self, position: int, count: int) -> str | None:
        """The variable for output ``position`` of ``count`` (an op returning a tuple)."""
        if self.part is None and count > 1 and len(self.names) == count:
            return self.names[position]
        name = self.single()
        if name is None:
            return None
        return f"{name}[{position}]" if count > 1 else name


def targets_here() -> Targets | None:
    """The targets of the innermost user frame's running call (None: not an assignment)."""
    frame = user_frame(2)
    return None if frame is None else frame_targets(frame)


def frame_targets(frame: FrameType) -> Targets | None:
    """The targets of ``frame``'s running call (see :class:`Targets`)."""
    code = frame.f_code
    position = _position(code, frame.f_lasti)
    if position is None:
        return None
    try:
        statement = _assignment_at(code.co_filename, position[0], position[2])
    except SourceBusy:  # made inside another parse (a finalizer): it goes unnamed
        return None
    if statement is None:
        return None
    return _targets(statement, position)


def label(variable: str | None, fallback: str, site: str) -> str:
    """``variable@file.py:12``: a tensor's name in reports (``fallback`` without a variable)."""
    file, _, line = site.rpartition(":")
    name = variable or fallback
    return f"{name}@{_file_name(file)}:{line}" if file and line.isdigit() else name


@functools.lru_cache(maxsize=4096)
def _file_name(file: str) -> str:
    """``Path(file).name``, kept per file (asked for every fresh tensor's label)."""
    return Path(file).name


def frame_site(frame: FrameType) -> str:
    """``file:line`` of ``frame`` as reports show it."""
    return f"{display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


@functools.lru_cache(maxsize=2048)
def _positions(code: CodeType) -> tuple[Position | None, ...]:
    return tuple(None if None in p else p  # type: ignore[misc]
                 for p in code.co_positions())


def _position(code: CodeType, lasti: int) -> Position | None:
    positions = _positions(code)
    index = lasti // 2  # one entry per 2-byte code unit
    return positions[index] if 0 <= index < len(positions) else None


@functools.lru_cache(maxsize=256)
def _assignments(filename: str) -> dict[int, list[ast.Assign | ast.AnnAssign]]:
    """Each assignment of a file, under every line it spans.

    Raises:
        SourceBusy: the file could not be parsed now (see :func:`recorder.sites.source_tree`).
    """
    tree = source_tree(filename)
    if tree is None:
        return {}
    by_line: dict[int, list[ast.Assign | ast.AnnAssign]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                by_line.setdefault(line, []).append(node)
    return by_line


def _assignment_at(filename: str, line: int, column: int) -> ast.Assign | ast.AnnAssign | None:
    """The innermost assignment whose value holds source position (line, column)."""
    for node in _assignments(filename).get(line, ()):
        if node.value is not None and _holds(node.value, (line, line, column, column)):
            return node  # assignments do not nest: the one holding the position
    return None


def _holds(node: ast.expr, position: Position) -> bool:
    line, end_line, column, end_column = position
    start = (node.lineno, node.col_offset)
    end = (node.end_lineno or node.lineno, node.end_col_offset or node.col_offset)
    return start <= (line, column) and (end_line, end_column) <= end


def _dotted(node: ast.expr) -> str | None:
    """``buf`` or ``self.side`` for a Name or attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _targets(statement: ast.Assign | ast.AnnAssign, position: Position) -> Targets | None:
    target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
    if not isinstance(target, ast.Tuple | ast.List):
        name = _dotted(target)
        return None if name is None else Targets((name,))
    names = tuple(_dotted(t) for t in target.elts)
    value = statement.value
    if isinstance(value, ast.Tuple | ast.List) and len(value.elts) == len(names):
        for part, element in enumerate(value.elts):
            if _holds(element, position):
                return Targets(names, part)
        return None
    return Targets(names)


def variable_here() -> str | None:
    """The variable the innermost user frame's running call is assigned to, if one."""
    frame = user_frame(2)
    if frame is None:
        return None
    targets = frame_targets(frame)
    return None if targets is None else targets.single()
