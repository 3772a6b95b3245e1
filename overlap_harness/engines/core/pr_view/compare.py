"""The difference two trees' runs make: new and fixed races, the changed lines each variant
ran, changed ordering lines no variant ran, and the change each new race is attributed to.

Races are matched by code and call site, never by line numbers: a race is its kind, its
buffer (named by its allocation's code), and per side the file, function, source text,
op and stream of the racing line. An edit above a race shifts its lines but not its match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.engines.core.pr_view.ordering import enclosing_functions, statement_starts
from overlap_harness.engines.core.pr_view.trees import Hunk, Tree


def race_key(race: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a race of one tree the same race in the other (no line numbers)."""
    def side(s: dict[str, Any]) -> tuple[Any, ...]:
        return (s["file"], s["function"], s["code"], s["op"], s["stream"])
    return (race["kind"], race["tensor_key"], side(race["first"]), side(race["second"]))


@dataclass
class RaceGroup:
    """One race (by :func:`race_key`) with every variant and iteration it appeared in."""

    key: tuple[Any, ...]
    example: dict[str, Any]
    variants: list[str] = field(default_factory=list)
    count: int = 0

    def add(self, race: dict[str, Any]) -> None:
        """Count one more occurrence."""
        self.count += 1
        if race["variant"] not in self.variants:
            self.variants.append(race["variant"])


def group_races(races: Sequence[dict[str, Any]], variants: set[str]) -> dict[tuple, RaceGroup]:
    """The races of the ``variants`` (those both trees ran), grouped by key in order."""
    groups: dict[tuple, RaceGroup] = {}
    for race in races:
        if race["variant"] in variants:
            key = race_key(race)
            groups.setdefault(key, RaceGroup(key, race)).add(race)
    return groups


class Coverage:
    """The lines each variant ran, per side, by statement."""

    def __init__(self, tree: Tree, covered: dict[str, dict[str, list[str]]]) -> None:
        self.tree = tree
        self.covered = covered
        self._starts: dict[str, dict[int, int]] = {}

    def starts(self, file: str) -> dict[int, int]:
        """Line -> its statement's first line (the line coverage reports), in this tree."""
        if file not in self._starts:
            path = self.tree.file(file)
            self._starts[file] = statement_starts(path) if path.is_file() else {}
        return self._starts[file]

    def executable(self, file: str, line: int) -> bool:
        """True when the line is part of a statement."""
        return line in self.starts(file)

    def variants(self, file: str, line: int) -> list[str]:
        """The variants that ran ``line``'s statement."""
        start = self.starts(file).get(line)
        return list(self.covered.get(file, {}).get(str(start), [])) if start else []


@dataclass
class ChangeView:
    """A hunk with what ran it."""

    hunk: Hunk
    reached_by: list[str]
    executable: bool
    #: the removed half of a move and nothing else: the move's one verdict covers it
    part_of_move: bool = False

    @property
    def ordering(self) -> bool:
        """True when the hunk adds or removes a stream-ordering line (a moved-away line
        counts at the line it moved to)."""
        return bool(self.hunk.head_ordering) or (bool(self.hunk.base_ordering)
                                                 and self.hunk.moved_to is None)

    @property
    def location(self) -> str:
        """``file:line``: the first ordering line of HEAD, else the hunk's first line."""
        lines = sorted(self.hunk.head_ordering) or [self.hunk.head_first]
        return f"{self.hunk.file}:{lines[0]}"

    def what(self) -> str:
        """A few words on the change: the ordering code it moved, removed or added, else the
        lines it edited."""
        hunk = self.hunk
        if hunk.moved_from is not None:
            return f"moved `{_codes(hunk.head_code, hunk.head_ordering)}` " \
                f"(from line {hunk.moved_from})"
        if hunk.base_ordering and hunk.moved_to is None and not hunk.head_ordering:
            return f"removed `{_codes(hunk.base_code, hunk.base_ordering)}`"
        if hunk.head_ordering:
            verb = "edited" if hunk.base_ordering else "added"
            return f"{verb} `{_codes(hunk.head_code, hunk.head_ordering)}`"
        if hunk.removal:
            return "removed lines"
        return f"edited lines {hunk.head_first}-{hunk.head_last}" \
            if hunk.head_first != hunk.head_last else "edited line"

    def to_json(self) -> dict[str, Any]:
        """``{file, lines, reached_by, ...}`` as the document lists it."""
        hunk = self.hunk
        out: dict[str, Any] = {"file": hunk.file, "lines": [hunk.head_first, hunk.head_last],
                               "reached_by": self.reached_by, "executable": self.executable,
                               "ordering": sorted(set(hunk.head_ordering.values())
                                                  | set(hunk.base_ordering.values()))}
        if hunk.removal:
            out["removed"] = hunk.removed_code
        if hunk.moved_from is not None:
            out["moved_from"] = hunk.moved_from
        if hunk.moved_to is not None:
            out["moved_to"] = hunk.moved_to
            out["part_of_move"] = self.part_of_move
        return out


def _codes(code: dict[int, str], lines: dict[int, str]) -> str:
    """The text of ``lines``: a statement's continuation lines joined to it, statements
    separated by ``;``."""
    text = ""
    for piece in (code.get(n, "") for n in sorted(lines)):
        joined = not text or text.endswith(("(", "[", "{", ",")) or piece.startswith(
            (")", "]", "}"))
        text += ("" if joined else "; ") + piece
    return text[:100]


def change_views(hunks: Sequence[Hunk], head: Coverage, base: Coverage) -> list[ChangeView]:
    """Each hunk with the variants that ran its HEAD lines (or, for removed lines, ran them in
    BASE)."""
    views = []
    for hunk in hunks:
        reached: set[str] = set()
        executable = False
        for line in hunk.head_lines:
            executable |= head.executable(hunk.file, line)
            reached.update(head.variants(hunk.file, line))
        for line in hunk.base_lines:
            executable |= base.executable(hunk.file, line)
            reached.update(base.variants(hunk.file, line))
        views.append(ChangeView(hunk, sorted(reached), executable))
    for view in views:
        view.part_of_move = _only_moved(view.hunk, hunks)
    return views


def move_target(view: ChangeView, views: Sequence[ChangeView]) -> ChangeView:
    """The hunk a removed-only half of a move moved its line to (``view`` itself for any
    other change): a race or verdict of the removed half belongs to the move."""
    if not view.part_of_move:
        return view
    hunk = view.hunk
    return next((v for v in views if v.hunk.file == hunk.file and v.hunk.moved_from is not None
                 and hunk.moved_to in v.hunk.head_lines), view)


def _only_moved(hunk: Hunk, hunks: Sequence[Hunk]) -> bool:
    """True when ``hunk`` only removes lines that another hunk of its file added (the
    removed half of a move)."""
    if hunk.moved_to is None or not hunk.removal:
        return False
    added = {code for other in hunks if other.file == hunk.file and other is not hunk
             for code in other.head_code.values()}
    return all(code in added for code in hunk.removed_code if code)


def unreached_lines(views: Sequence[ChangeView], head: Coverage, base: Coverage,
                    head_text: dict[str, list[str]], base_text: dict[str, list[str]]
                    ) -> list[dict[str, Any]]:
    """Changed ordering lines no variant ran: added ones in HEAD, removed ones in BASE (those
    listed at the hunk's surviving line, with the removed code)."""
    out = []
    for view in views:
        hunk = view.hunk
        for line, kind in sorted(hunk.head_ordering.items()):
            if not head.variants(hunk.file, line) and head.executable(hunk.file, line):
                out.append({"file": hunk.file, "line": line, "kind": kind,
                            "code": head_text[hunk.file][line - 1].strip()})
        for line, kind in sorted(hunk.base_ordering.items()):
            if not base.variants(hunk.file, line) and base.executable(hunk.file, line):
                out.append({"file": hunk.file, "line": hunk.head_first, "kind": kind,
                            "code": base_text[hunk.file][line - 1].strip(),
                            "removed": True, "base_line": line})
    return out


class Attributor:
    """Names the change a new race is attributed to: the changed ordering line nearest on the
    racing sides' stacks (by frame depth, then line distance within the frame's function),
    else a changed line a side's stack passes through, else the nearest changed ordering line
    in a file on the stacks."""

    def __init__(self, views: Sequence[ChangeView], head: Tree) -> None:
        self.views = views
        self.head = head
        self._functions: dict[str, list[tuple[int, int, str]]] = {}

    def _span(self, file: str, line: int) -> tuple[int, int]:
        if file not in self._functions:
            path = self.head.file(file)
            self._functions[file] = enclosing_functions(path) if path.is_file() else []
        inner = [(a, b) for a, b, _ in self._functions[file] if a <= line <= b]
        return inner[-1] if inner else (line, line)

    def attribute(self, race: dict[str, Any]) -> tuple[ChangeView | None, str]:
        """The change and how it was found (a note for the report)."""
        frames = []
        for side in (race["first"], race["second"]):
            frames += [(depth, f) for depth, f in enumerate(side.get("stack", []))]
        best: tuple[Any, ...] | None = None
        for depth, frame in frames:
            first, last = self._span(frame["file"], frame["line"])
            for index, view in enumerate(self.views):
                hunk = view.hunk
                if hunk.file != frame["file"] or hunk.head_last < first \
                        or hunk.head_first > last:
                    continue
                on_line = hunk.head_first <= frame["line"] <= hunk.head_last
                distance = min(abs(frame["line"] - hunk.head_first),
                               abs(frame["line"] - hunk.head_last))
                rank = (not view.ordering, not on_line if not view.ordering else 0,
                        depth, distance, index)
                if best is None or rank < best[0]:
                    best = (rank, view)
        if best is not None:
            view = best[1]
            if view.ordering:
                return view, "the changed ordering line nearest on the racing stacks"
            if best[0][1] == 0:
                return view, "a changed line on a racing side's stack"
            return view, "a changed line in a function on the racing stacks"
        files = {f["file"] for _, f in frames}
        for view in self.views:
            if view.ordering and view.hunk.file in files:
                return view, "a changed ordering line in a file on the racing stacks"
        for view in self.views:
            if view.ordering:
                return view, "no change on the racing stacks; the first changed ordering line"
        return (self.views[0] if self.views else None), "no change on the racing stacks"
