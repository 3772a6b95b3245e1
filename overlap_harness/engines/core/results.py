"""Races and verdicts of engine runs as plain data (the JSON the command writes)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from overlap_harness.model.trace import Access, Race
from overlap_harness.recorder.sites import split_site


class Verdict(StrEnum):
    """What removing one sync site did to one variant."""

    NECESSARY = "necessary"  # races that the intact code does not have
    REDUNDANT = "redundant"  # reached, and no new race
    NOT_REACHED = "not_reached"  # the variant never runs the site's line
    ERROR = "error"  # the mutated run crashed (the message says how)


#: the checkout (or site-packages) holding the harness's own package
HARNESS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
_tree_root: list[str | None] = [None]  # name_files_relative_to's root; None: absolute


def name_files_relative_to(tree_root: str | os.PathLike[str] | None) -> None:
    """From now on in this process (and its forked children), race records and necessity
    rows name a file of the engine's tree relative to ``tree_root``, the folder holding the
    engine's package (``sglang/srt/managers/scheduler.py``), and a file of the harness
    relative to its checkout (``overlap_harness/engines/sglang/stand_ins/model_worker.py``),
    the same whichever machine or folder ran; None: every file absolute, as run (the
    pull-request view's children, which name files against each tree themselves)."""
    _tree_root[0] = None if tree_root is None else os.path.abspath(tree_root)


def shown_file(filename: str) -> str:
    """``filename`` as race records and necessity rows name it (:func:`name_files_relative_to`);
    a file outside the tree and the harness (the standard library, torch) stays absolute."""
    path = os.path.abspath(filename)
    root = _tree_root[0]
    if root is None:
        return path
    for base in (root, HARNESS_ROOT):  # the tree first: it may lie inside the checkout
        if path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return path


def files_root() -> str | None:
    """The root :func:`name_files_relative_to` set (None: files are named absolutely)."""
    return _tree_root[0]


def shown_site(site: str) -> str:
    """A recorder site (``file:line``, the file as the recorder shows it: relative to the
    working directory when under it, else absolute) with its file as :func:`shown_file`
    names it; a site without a line number stays as it is."""
    file, line = split_site(site)
    return f"{shown_file(file)}:{line}" if file and line is not None else site


def _side(access: Access) -> dict[str, Any]:
    file, line = split_site(access.source)
    return {"file": shown_file(file) if file else "", "line": line,
            "op": access.op_name, "stream": access.agent}


def race_record(race: Race, variant: str) -> dict[str, Any]:
    """One race as the command's JSON writes it (files as :func:`shown_file` names them)."""
    return {"kind": str(race.kind), "tensor": race.buffer, "variant": variant,
            "iteration": race.second.iteration, "first": _side(race.first),
            "second": _side(race.second)}


def race_signature(record: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two races the same race across runs (not op ids or iterations)."""
    return (record["kind"], record["tensor"], record["first"]["file"], record["first"]["line"],
            record["second"]["file"], record["second"]["line"])


@dataclass
class VariantOutcome:
    """One variant's run: its races (records), how far it got, a crash if any."""

    variant: str
    races: list[dict[str, Any]] = field(default_factory=list)
    iterations: int = 0
    seconds: float = 0.0
    error: str | None = None
    unknown_ops: list[str] = field(default_factory=list)
    ops: int = 0  # ops the recorder recorded (an adapter without iterations reports these)


@dataclass
class NecessityRow:
    """One site x variant of the necessity table."""

    site: str  # file:line, the file as shown_file names it
    code: str
    kind: str
    variant: str
    verdict: Verdict
    races: list[dict[str, Any]] = field(default_factory=list)
    reached: int = 0
    error: str | None = None
    function: str = ""  # the enclosing function's qualified name

    def to_json(self) -> dict[str, Any]:
        """The row as JSON; ``real`` is the verdict in the loop report's words (the mutated
        real code races, is race-free, or never runs the site)."""
        real = {Verdict.NECESSARY: "race", Verdict.REDUNDANT: "race_free"}.get(
            self.verdict, str(self.verdict))
        return {"site": self.site, "code": self.code, "kind": self.kind,
                "variant": self.variant, "verdict": str(self.verdict), "real": real,
                "reached": self.reached, "races": self.races, "error": self.error,
                "function": self.function}
