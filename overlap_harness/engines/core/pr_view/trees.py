"""The two trees of a pull request and their changed hunks.

HEAD is the tree given with ``--sglang-src``/``--vllm-src``; BASE is a second tree, or a git
revision of HEAD's checkout, written out with ``git archive`` into a temporary folder. The
changed Python files are found by walking the engine's package in both trees (a file that
resolves to the same file in both, as a mirror's links do, is unchanged without being read);
each changed file's hunks come from :class:`difflib.SequenceMatcher`. Paths are relative to
the tree root (the folder given: a checkout's root, so a code-scanning upload finds them).
"""

from __future__ import annotations

import difflib
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from overlap_harness.engines.core.pr_view.ordering import ordering_lines, statement_lines
from overlap_harness.model.errors import HarnessError

#: where each engine's package lies in a tree root (a checkout keeps SGLang's in python/)
PACKAGE_FOLDERS = {"sglang": ("sglang", "python/sglang"), "vllm": ("vllm",),
                   "tokenspeed": ("tokenspeed", "python/tokenspeed")}


class TreeError(HarnessError):
    """A tree or revision cannot be read."""


@dataclass(frozen=True, slots=True)
class Tree:
    """One side: its root (paths are relative to it) and the engine package folder in it."""

    root: Path
    package: Path

    def file(self, relative: str) -> Path:
        """The absolute path of a file given relative to the root."""
        return self.root / relative


def engine_tree(engine: str, source: str | Path) -> Tree:
    """The tree at ``source`` for ``engine``: the folder holding the package (or a checkout
    holding it in ``python/``; or the package folder itself, whose parent is then the root)."""
    root = Path(source).expanduser().resolve()
    if not root.is_dir():
        raise TreeError(f"{source}: not a folder")
    for folder in PACKAGE_FOLDERS[engine]:
        if (root / folder / "__init__.py").is_file():
            return Tree(root, root / folder)
    if root.name == engine and (root / "__init__.py").is_file():
        return Tree(root.parent, root)
    raise TreeError(f"{source}: no {engine} package here")


def _git(root: Path, *arguments: str) -> str:
    result = subprocess.run(["git", "-C", str(root), *arguments], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise TreeError(f"git {' '.join(arguments)}: {result.stderr.strip()}")
    return result.stdout.strip()


def materialise_base(engine: str, head: Tree, base: str, scratch: Path) -> Tree:
    """BASE as a tree: the folder ``base`` when it is one, else the git revision ``base`` of
    HEAD's checkout written out under ``scratch`` (the same root-relative layout)."""
    if Path(base).expanduser().is_dir():
        return engine_tree(engine, base)
    toplevel = Path(_git(head.root, "rev-parse", "--show-toplevel")).resolve()
    commit = _git(head.root, "rev-parse", "--verify", f"{base}^{{commit}}")
    archive = scratch / "base.tar"
    with archive.open("wb") as out:
        done = subprocess.run(["git", "-C", str(toplevel), "archive", "--format=tar", commit],
                              stdout=out, stderr=subprocess.PIPE, check=False)
    if done.returncode != 0:
        raise TreeError(f"git archive {base}: {done.stderr.decode().strip()}")
    target = scratch / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    inside = head.root.resolve().relative_to(toplevel)
    return engine_tree(engine, target / inside)


def scratch_folder() -> Path:
    """A fresh temporary folder for a materialised base (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix="overlap-harness-base-"))


def _python_files(package: Path, root: Path) -> dict[str, Path]:
    found = {}
    for folder, folders, files in os.walk(package, followlinks=True):
        folders[:] = [f for f in folders if f != "__pycache__" and not f.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                found[str(path.relative_to(root))] = path
    return found


def _differ(a: Path, b: Path) -> bool:
    """True when two files' contents differ (the same file by its links never does)."""
    if a.resolve() == b.resolve():
        return False
    return a.stat().st_size != b.stat().st_size or a.read_bytes() != b.read_bytes()


def changed_files(head: Tree, base: Tree) -> list[str]:
    """The Python files of the engine package that differ (added, removed or edited), as
    paths relative to the roots, sorted."""
    ours = _python_files(head.package, head.root)
    theirs = _python_files(base.package, base.root)
    changed = []
    for relative in sorted(set(ours) | set(theirs)):
        a, b = ours.get(relative), theirs.get(relative)
        if a is None or b is None or _differ(a, b):
            changed.append(relative)
    return changed


@dataclass
class Hunk:
    """One changed region of a file: the HEAD lines it holds (``head_first`` ..
    ``head_last``; for a pure removal both are the anchor, the nearest surviving statement),
    the BASE lines it replaced, and per side which of those lines hold a stream-ordering
    operation (``{line: kind}``)."""

    file: str
    head_first: int
    head_last: int
    base_lines: list[int]
    head_lines: list[int]
    removed_code: list[str] = field(default_factory=list)
    head_ordering: dict[int, str] = field(default_factory=dict)
    base_ordering: dict[int, str] = field(default_factory=dict)
    head_code: dict[int, str] = field(default_factory=dict)  # HEAD lines' stripped text
    base_code: dict[int, str] = field(default_factory=dict)  # BASE lines' stripped text
    moved_from: int | None = None  # an ordering line removed elsewhere in the file and added here
    moved_to: int | None = None  # this hunk's removed ordering line was added at that line

    @property
    def removal(self) -> bool:
        """True when the hunk only removes lines (anchored at a surviving one)."""
        return not self.head_lines


def _anchor(statements: list[int], position: int, length: int) -> int:
    """The surviving statement line nearest the point ``position`` (1-based line now at the
    removal; ties go to the statement after)."""
    if not statements:
        return max(1, min(position, length))
    return min(statements, key=lambda line: line - position if line >= position
               else position - line - 0.5)


def _lines(path: Path | None) -> list[str]:
    return path.read_text().splitlines() if path is not None and path.is_file() else []


def file_hunks(relative: str, head: Tree, base: Tree) -> list[Hunk]:
    """The hunks of one changed file (difflib's opcodes other than equal)."""
    head_path, base_path = head.file(relative), base.file(relative)
    ours, theirs = _lines(head_path), _lines(base_path)
    head_order = ordering_lines(head_path) if head_path.is_file() else {}
    base_order = ordering_lines(base_path) if base_path.is_file() else {}
    statements = statement_lines(head_path) if head_path.is_file() else []
    matcher = difflib.SequenceMatcher(None, theirs, ours, autojunk=False)
    hunks = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        head_lines = list(range(j1 + 1, j2 + 1))
        base_lines = list(range(i1 + 1, i2 + 1))
        if head_lines:
            first, last = head_lines[0], head_lines[-1]
        else:
            first = last = _anchor(statements, j1 + 1, len(ours))
        hunks.append(Hunk(relative, first, last, base_lines, head_lines,
                          [theirs[i - 1].strip() for i in base_lines],
                          {n: head_order[n] for n in head_lines if n in head_order},
                          {n: base_order[n] for n in base_lines if n in base_order},
                          {n: ours[n - 1].strip() for n in head_lines},
                          {n: theirs[n - 1].strip() for n in base_lines}))
    _pair_moves(hunks, ours, theirs)
    return hunks


def _pair_moves(hunks: list[Hunk], ours: list[str], theirs: list[str]) -> None:
    """Mark an ordering line removed in one hunk and added, same text, in another as moved."""
    added = {(ours[n - 1].strip(), n): h for h in hunks for n in h.head_ordering}
    for hunk in hunks:
        for line in hunk.base_ordering:
            text = theirs[line - 1].strip()
            for (code, new_line), target in added.items():
                if code == text and target is not hunk and target.moved_from is None:
                    target.moved_from, hunk.moved_to = line, new_line
                    break


def tree_hunks(head: Tree, base: Tree) -> list[Hunk]:
    """Every hunk of every changed Python file, in file then line order."""
    return [h for relative in changed_files(head, base) for h in file_hunks(relative, head, base)]
