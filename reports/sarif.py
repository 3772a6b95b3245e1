"""SARIF 2.1.0 for races, so code-scanning UIs show them on the scenario file.

One rule per race kind; one result per race. Its location is the scenario file, at the line
of the mutation that removed the sync (its ``remove``/``set`` line) or of the scenario's
``name``; related locations are the protocol source lines of both accesses and, for a
mutation, the sync that would have ordered them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model.results import CaseResult
from model.trace import Access, RaceKind

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
ROOT = Path(__file__).resolve().parent.parent


def artifact(path: str) -> dict[str, str]:
    """A SARIF artifactLocation: repository-relative under %SRCROOT% where possible (what
    code-scanning UIs expect), else a file:// URI."""
    p = Path(path)
    full = p if p.is_absolute() else (Path.cwd() / p)
    try:
        return {"uri": full.resolve().relative_to(ROOT).as_posix(), "uriBaseId": "%SRCROOT%"}
    except ValueError:
        return {"uri": full.resolve().as_uri()}

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


def _source_location(a: Access, idx: int) -> dict[str, Any] | None:
    if not a.source or ":" not in a.source:
        return None
    file, _, line = a.source.rpartition(":")
    if not line.isdigit():
        return None
    return {"id": idx, "message": {"text": a.describe()},
            "physicalLocation": {"artifactLocation": artifact(file),
                                 "region": {"startLine": int(line)}}}


def _results(case: CaseResult) -> list[dict[str, Any]]:
    needles = [f'"{label}"' for label in case.removed] + [f'name = "{case.mutation}"',
                                                          f'name = "{case.scenario}"']
    line = _line_of(case.path, needles)
    out = []
    for race in case.races:
        related = [loc for i, a in enumerate((race.first, race.second))
                   if (loc := _source_location(a, i)) is not None]
        for j, label in enumerate(case.removed):
            related.append({"id": 10 + j, "message": {
                "text": f"removed sync {label!r} would order these accesses"},
                "physicalLocation": {"artifactLocation": artifact(case.path),
                                     "region": {"startLine": line}}})
        out.append({
            "ruleId": str(race.kind),
            "level": "error" if case.expect != "race" else "note",
            "message": {"text": f"{case.name}: {race.describe()}"},
            "locations": [{"physicalLocation": {"artifactLocation": artifact(case.path),
                                                "region": {"startLine": line}}}],
            "relatedLocations": related,
            "properties": {"manifest": race.manifest, "run_id": case.run_id},
        })
    return out


def to_sarif(cases: Sequence[CaseResult]) -> dict[str, Any]:
    """The SARIF log of every race of ``cases``. Races a case expected are level ``note``."""
    rules = [{"id": str(k), "name": f"{k}Race".replace("-", ""),
              "shortDescription": {"text": f"{k} race"}, "fullDescription": {"text": text},
              "help": {"text": text}} for k, text in RULES.items()]
    results = [r for c in cases for r in _results(c)]
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [{
        "tool": {"driver": {"name": "overlap-harness", "rules": rules}},
        "results": results}]}


def write_sarif(cases: Sequence[CaseResult], path: str | Path) -> None:
    """Write :func:`to_sarif` to ``path``."""
    Path(path).write_text(json.dumps(to_sarif(cases), indent=1) + "\n")
