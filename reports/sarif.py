"""SARIF 2.1.0 for races, so code-scanning UIs (GitHub, VS Code SARIF viewer) list them.

One rule per race kind, with help text saying what the kind means and how it is usually
fixed. One result per race: its location is the scenario file (the ``name`` line, or the
mutation's ``remove`` line for a mutation, found by scanning the file text; line 1 when the
file cannot be read), and its related locations are the protocol source lines of both
accesses and, for a mutation, the removed sync that would have ordered them.

Level: ``error`` for a race in a run that expected none, ``note`` for a race a mutation
expected (it demonstrates that the removed sync is necessary).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from model.results import CaseResult
from model.trace import Access, Race, RaceKind, describe_elements

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"

#: kind -> (rule name, short description, help text)
RULES: dict[RaceKind, tuple[str, str, str]] = {
    RaceKind.RAW: (
        "ReadAfterWriteRace",
        "A stream reads elements another agent writes, with no happens-before edge.",
        "The reader may see the old value. Order the writer before the reader: record an "
        "event after the write on the writer's stream and make the reader's stream wait on "
        "it (or keep the sync this mutation removed)."),
    RaceKind.WAR: (
        "WriteAfterReadRace",
        "A write may land before an earlier-issued read of the same elements has run.",
        "The reader may see the new value. Make the writer's stream wait until the read is "
        "done (a read-done event or a barrier on the reading stream) before it overwrites."),
    RaceKind.WAW: (
        "WriteAfterWriteRace",
        "Two unordered writes to the same elements: the final value depends on timing.",
        "Order the two writers with an event, or give them disjoint elements."),
    RaceKind.HOST_D2H: (
        "HostReadsUnfinishedCopy",
        "The host touches pinned memory that a non-blocking device copy also touches, "
        "without synchronizing on the copy.",
        "Synchronize the copy's stream or its completion event on the host before reading "
        "the pinned buffer (e.g. d2h.host_sync, copy_done.host_sync)."),
    RaceKind.REUSE: (
        "AllocatorReuseRace",
        "Memory freed while a stream still used it was handed out again and overwritten.",
        "Call record_stream for every stream that uses the tensor, or keep the tensor alive "
        "until that stream's work is done (the batch pin ring)."),
}


def scenario_line(path: str, mutation: str = "", removed: Sequence[str] = ()) -> int:
    """1-based line in the scenario file to point at: the mutation's ``remove`` entry (or
    its ``name``) for a mutation, the top-level ``name`` otherwise; 1 when not found."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return 1
    name_re = re.compile(r'^\s*name\s*=\s*"([^"]*)"')
    if not mutation:
        for i, line in enumerate(lines, 1):
            if line.lstrip().startswith("["):
                break
            if name_re.match(line):
                return i
        return 1
    blocks: list[list[int]] = []  # line numbers of each [[mutation]] table
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("["):
            if stripped.replace(" ", "") == "[[mutation]]":
                blocks.append([i])
            elif blocks and blocks[-1] and not stripped.startswith("[[mutation"):
                blocks.append([])  # another table ends the mutation block
            continue
        if blocks and blocks[-1]:
            blocks[-1].append(i)
    for block in (b for b in blocks if b):
        text = {i: lines[i - 1] for i in block}
        name = next((m.group(1) for m in map(name_re.match, text.values()) if m), "")
        remove_at = next((i for i, t in text.items() if re.match(r"^\s*remove\s*=", t)), None)
        labels = re.findall(r'"([^"]+)"', text[remove_at]) if remove_at else []
        if name == mutation or (not name and "+".join(labels) == mutation) or (
                not name and removed and sorted(labels) == sorted(removed)):
            return remove_at or block[0]
    return 1


def _split_source(source: str) -> tuple[str, int]:
    file, _, line = source.rpartition(":")
    if not file or not line.isdigit():
        return source or "<unknown>", 1
    return file, int(line)


def _uri(file: str) -> dict[str, Any]:
    p = Path(file)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return {"uri": p.as_uri()}
    return {"uri": p.as_posix(), "uriBaseId": "%SRCROOT%"}


def _location(file: str, line: int, message: str | None = None,
              loc_id: int | None = None) -> dict[str, Any]:
    loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": _uri(file),
                                                "region": {"startLine": max(1, line)}}}
    if loc_id is not None:
        loc["id"] = loc_id
    if message:
        loc["message"] = {"text": message}
    return loc


def _access_location(acc: Access, which: str, loc_id: int) -> dict[str, Any]:
    file, line = _split_source(acc.source)
    return _location(file, line, f"{which} access: {acc.describe()}", loc_id)


def race_result(case: CaseResult, race: Race, rule_index: int) -> dict[str, Any]:
    """The SARIF result of one race of ``case``."""
    line = scenario_line(case.path, case.mutation, case.removed)
    state = {True: "manifest", False: "latent", None: "unknown"}[race.manifest]
    elements = describe_elements(race.shape, race.elements)
    text = (f"{case.name}: {race.kind} race on {race.buffer}{elements} ({state}) between "
            f"{race.first.op_name} on {race.first.agent} (iteration {race.first.iteration}) "
            f"and {race.second.op_name} on {race.second.agent} "
            f"(iteration {race.second.iteration})")
    if case.removed:
        text += f"; removed sync: {', '.join(case.removed)}"
    related = [_access_location(race.first, "first", 1),
               _access_location(race.second, "second", 2)]
    for i, label in enumerate(case.removed, 3):
        related.append(_location(case.path or "<scenario>", line,
                                 f"removed sync {label} would order these accesses", i))
    return {
        "ruleId": str(race.kind),
        "ruleIndex": rule_index,
        "level": "note" if case.expect == "race" else "error",
        "message": {"text": text},
        "locations": [_location(case.path or "<scenario>", line)],
        "relatedLocations": related,
        "partialFingerprints": {"raceKey/v1": f"{case.run_id}|{race.key}|{elements}|"
                                              f"{race.first.op_name}|{race.second.op_name}"},
        "properties": {"scenario": case.scenario, "mutation": case.mutation or "base",
                       "run_id": case.run_id, "buffer": race.buffer, "elements": elements,
                       "manifest": race.manifest, "report": race.describe()},
    }


def to_sarif(results: Sequence[CaseResult], tool_version: str = "0") -> dict[str, Any]:
    """The SARIF log (as a dict) for every race of ``results``."""
    kinds = list(RaceKind)
    rules = [{"id": str(k), "name": RULES[k][0],
              "shortDescription": {"text": RULES[k][1]},
              "fullDescription": {"text": RULES[k][1]},
              "help": {"text": RULES[k][2], "markdown": RULES[k][2]},
              "defaultConfiguration": {"level": "error"},
              "properties": {"tags": ["concurrency", "cuda-streams"]}} for k in kinds]
    out = [race_result(c, race, kinds.index(race.kind)) for c in results for race in c.races]
    run = {"tool": {"driver": {"name": "overlap-harness", "version": tool_version,
                               "informationUri": "https://github.com/sgl-project/sglang",
                               "rules": rules}},
           "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().as_uri() + "/"}},
           "results": out}
    return {"$schema": SCHEMA, "version": VERSION, "runs": [run]}


def write_sarif(results: Sequence[CaseResult], path: str | Path) -> Path:
    """Write :func:`to_sarif` to ``path``."""
    path = Path(path)
    path.write_text(json.dumps(to_sarif(results), indent=1) + "\n")
    return path
