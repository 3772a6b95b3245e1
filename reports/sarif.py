"""SARIF 2.1.0 for races, so code-scanning UIs show them on the scenario file or program.

One rule per race kind; one result per race. For a scenario, its location is the scenario
file, at the line of the mutation that removed the sync (its ``remove``/``set`` line) or of
the scenario's ``name``; related locations are the protocol source lines of both accesses
and, for a mutation, the sync that would have ordered them. For a checked program
(``at_accesses``: ``overlap-harness check``), the location is the later access's line and the
related location the earlier one's: where the program races. Paths are relative to
``%SRCROOT%`` (the repository around the working directory, or an engine command's tree; a
UI supplies its checkout) or,
for the harness's own sources elsewhere, to ``HARNESSROOT``: the log is the same on every
machine.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import Access, Race, RaceKind

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HARNESS_ROOT = Path(__file__).resolve().parent.parent
SRCROOT, HARNESS = "%SRCROOT%", "HARNESSROOT"


def repository_root(start: Path | None = None) -> Path:
    """The repository the user works in: the nearest folder at or above ``start`` (default:
    the working directory) that holds ``.git``, else ``start`` itself."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return here


def artifact(path: str, root: Path | None = None, named_from_root: bool = False
             ) -> dict[str, str]:
    """A SARIF artifactLocation relative to a base id, never an absolute URI.

    Under the user's repository (``root``, default :func:`repository_root`): relative to
    ``%SRCROOT%``, what code-scanning UIs resolve against the checkout. The harness's own
    source lines outside it: relative to ``HARNESSROOT``. Anything else: a relative path
    from ``%SRCROOT%`` (``../``), so the log holds no machine-specific path.
    ``named_from_root``: a relative ``path`` is already named from ``root`` (an engine
    command's records: the tree's files from its root, the harness's from its checkout),
    not from the working directory.
    """
    if named_from_root and root is not None and not Path(path).is_absolute():
        return dict(_named(path, root))
    return dict(_relative(path, root or repository_root(), Path.cwd()))


@functools.lru_cache(maxsize=4096)
def _named(path: str, root: Path) -> tuple[tuple[str, str], ...]:
    """(uri, uriBaseId) of ``path`` named from ``root``, or from the harness's checkout when
    only that holds it (the tree is asked first: it may lie inside the checkout)."""
    harness = not (root / path).exists() and (HARNESS_ROOT / path).exists()
    return (("uri", Path(path).as_posix()), ("uriBaseId", HARNESS if harness else SRCROOT))


@functools.lru_cache(maxsize=4096)
def _relative(path: str, base: Path, cwd: Path) -> tuple[tuple[str, str], ...]:
    """(uri, uriBaseId) of ``path``; cached, as a suite names the same few files thousands of
    times."""
    full = (Path(path) if Path(path).is_absolute() else cwd / path).resolve()
    for folder, base_id in ((base, SRCROOT), (HARNESS_ROOT, HARNESS)):
        if full.is_relative_to(folder):
            return (("uri", full.relative_to(folder).as_posix()), ("uriBaseId", base_id))
    return (("uri", Path(os.path.relpath(full, base)).as_posix()), ("uriBaseId", SRCROOT))


RULES = {
    RaceKind.RAW: "A read is not ordered after the write it should see: it may read a stale "
                  "value.",
    RaceKind.WAR: "A write is not ordered after a read of the same elements: it may clobber "
                  "data still being read.",
    RaceKind.WAW: "Two writes of the same elements are unordered: the final value depends on "
                  "timing.",
    RaceKind.HOST_D2H: "The host touches pinned memory that a copy writes or reads, with no "
                       "host sync ordering them.",
    RaceKind.REUSE: "The caching allocator handed out memory still in use by another stream "
                    "(no record_stream or sync covers it).",
}


def _line_of(path: str, needles: Sequence[str]) -> int:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return 1
    for needle in needles:
        for i, line in enumerate(lines, 1):
            if needle and needle in line:
                return i
    return 1


def _source_location(a: Access, idx: int, root: Path, named_from_root: bool = False
                     ) -> dict[str, Any] | None:
    if not a.source or ":" not in a.source:
        return None
    file, _, line = a.source.rpartition(":")
    if not line.isdigit():
        return None
    return {"id": idx, "message": {"text": a.describe()},
            "physicalLocation": {"artifactLocation": artifact(file, root, named_from_root),
                                 "region": {"startLine": int(line)}}}


def _access_results(case: CaseResult, root: Path, describe: Callable[[Race], str],
                    named_from_root: bool = False) -> list[dict[str, Any]]:
    """A checked program's races, located at the later access, the earlier one related."""
    out = []
    for race in case.races:
        primary = _source_location(race.second, 0, root, named_from_root)
        related = _source_location(race.first, 1, root, named_from_root)
        if primary is None:
            primary, related = related, None
        text = describe(race)
        result: dict[str, Any] = {
            "ruleId": str(race.kind), "level": "error", "message": {"text": text},
            "relatedLocations": [related] if related is not None else [],
            "properties": {"run_id": case.run_id}}
        if primary is not None:
            result["locations"] = [{"physicalLocation": primary["physicalLocation"]}]
        out.append(result)
    return out


def _results(case: CaseResult, root: Path) -> list[dict[str, Any]]:
    needles = [f'"{label}"' for label in case.removed] + [f'name = "{case.mutation}"',
                                                          f'name = "{case.scenario}"']
    line = _line_of(case.path, needles)
    out = []
    for race in case.races:
        related = [loc for i, a in enumerate((race.first, race.second))
                   if (loc := _source_location(a, i, root)) is not None]
        for j, label in enumerate(case.removed):
            related.append({"id": 10 + j, "message": {
                "text": f"removed sync {label!r} would order these accesses"},
                "physicalLocation": {"artifactLocation": artifact(case.path, root),
                                     "region": {"startLine": line}}})
        out.append({
            "ruleId": str(race.kind),
            "level": "error" if case.expect != "race" else "note",
            "message": {"text": f"{case.name}: {race.describe()}"},
            "locations": [{"physicalLocation": {"artifactLocation": artifact(case.path, root),
                                                "region": {"startLine": line}}}],
            "relatedLocations": related,
            "properties": {"manifest": race.manifest, "run_id": case.run_id},
        })
    return out


def to_sarif(cases: Sequence[CaseResult], describe: Callable[[Race], str] | None = None,
             at_accesses: bool = False, source_root: Path | None = None) -> dict[str, Any]:
    """The SARIF log of every race of ``cases``. Races a case expected are level ``note``.
    ``at_accesses``: the cases are checked programs, located at their racing lines, each
    result's message ``describe(race)``. ``source_root``: the races name files from this
    folder (an engine's tree; the harness's files from its checkout), which is then
    ``%SRCROOT%``; default: the repository around the working directory."""
    rules = [{"id": str(k), "name": f"{k}Race".replace("-", ""),
              "shortDescription": {"text": f"{k} race"}, "fullDescription": {"text": text},
              "help": {"text": text}} for k, text in RULES.items()]
    root = source_root or repository_root()
    if at_accesses:
        results = [r for c in cases
                   for r in _access_results(c, root, describe or (lambda race: race.describe()),
                                            source_root is not None)]
    else:
        results = [r for c in cases for r in _results(c, root)]
    bases = {SRCROOT: {"description": {"text": "the repository checked (its working tree)"}},
             HARNESS: {"uri": HARNESS_ROOT.as_uri() + "/",
                       "description": {"text": "the overlap-harness sources"}}}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "overlap-harness", "rules": rules}},
        "originalUriBaseIds": bases, "results": results}]}


def write_sarif(cases: Sequence[CaseResult], path: str | Path,
                describe: Callable[[Race], str] | None = None, at_accesses: bool = False,
                source_root: Path | None = None) -> None:
    """Write :func:`to_sarif` to ``path``."""
    log = to_sarif(cases, describe, at_accesses, source_root)
    Path(path).write_text(json.dumps(log, indent=1) + "\n")
