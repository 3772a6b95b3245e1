"""A pull request's view as a reader sees it: the verdict per change first, then details;
and as SARIF, each result at the changed line (paths relative to the tree root, so a
code-scanning upload annotates the pull request's own line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _side(side: dict[str, Any]) -> str:
    where = f"{side['file']}:{side['line']}"
    stand_in = side.get("stands_in_for")
    if not side.get("in_tree", True) and stand_in:
        where += f" (harness stand-in for {stand_in['file']}:{stand_in['line']} " \
                 f"`{stand_in['code'][:60]}`)"
    return f"{side['op']} on {side['stream']} at {where}"


def race_line(race: dict[str, Any]) -> str:
    """One new or fixed race on one line: kind, tensor, both sides."""
    return (f"{race['kind']} {race['tensor']}: {_side(race['first'])} / "
            f"{_side(race['second'])}")


def text(document: dict[str, Any]) -> list[str]:
    """The report's lines: one verdict per change, then the races, the unreached lines and
    the exit verdict."""
    lines = []
    by_change: dict[int, list[dict[str, Any]]] = {}
    for race in document["races"]:
        by_change.setdefault(race["change_index"], []).append(race)
    for index, change in enumerate(document["changes"]):
        where = f"{change['file']}:{change['lines'][0]}"
        races = by_change.get(index, [])
        if races:
            count = sum(r["count"] for r in races)
            variants = sorted({v for r in races for v in r["variants"]})
            verdict = (f"{count} new races in {', '.join(variants)}; first: "
                       f"{race_line(races[0])}")
        elif change["reached_by"]:
            verdict = f"no new race (run by {', '.join(change['reached_by'])})"
        elif change["executable"]:
            verdict = "NOT RUN by any variant"
        else:
            verdict = "no statement changed"
        lines.append(f"{where} {change['what']}: {verdict}")
    if document["races"]:
        lines.append("new races:")
        for race in document["races"]:
            lines.append(f"  {race_line(race)} [{race['count']}x in "
                         f"{', '.join(race['variants'])}; change {race['change']}: "
                         f"{race['attribution']}]")
    if document["races_fixed"]:
        lines.append("races fixed (in BASE, gone in HEAD):")
        lines += [f"  {race_line(r)}" for r in document["races_fixed"]]
    for row in document.get("necessity_changed", []):
        lines.append(f"necessity changed: {row['file']}:{row['line']} `{row['code']}` "
                     f"{row['variant']}: {row['base']} -> {row['head']}")
    if document["unreached"]:
        lines.append("changed ordering lines no variant ran: " + "; ".join(
            f"{u['file']}:{u['line']} `{u['code']}`" + (" (removed)" if u.get("removed")
                                                         else "")
            for u in document["unreached"]))
    for name, reason in document.get("not_applicable", {}).items():
        lines.append(f"variant {name} not applicable to HEAD: {reason}")
    for name, error in document["errors"].items():
        lines.append(f"variant {name} cannot be driven: {error}")
    return lines


def sarif(document: dict[str, Any]) -> dict[str, Any]:
    """The new races and unreached ordering lines as SARIF 2.1.0, located at the change."""
    def location(file: str, line: int) -> list[dict[str, Any]]:
        return [{"physicalLocation": {"artifactLocation": {"uri": file},
                                      "region": {"startLine": max(1, line)}}}]
    results = []
    for race in document["races"]:
        file, _, line = race["change"].rpartition(":")
        results.append({"ruleId": "new-race", "level": "error", "locations":
                        location(file, int(line)), "message": {"text": (
                            f"{race['what']}: new {race_line(race)} in "
                            f"{', '.join(race['variants'])}")}})
    for item in document["unreached"]:
        results.append({"ruleId": "unreached-ordering-line", "level": "warning",
                        "locations": location(item["file"], item["line"]),
                        "message": {"text": f"no variant ran this changed stream-ordering "
                                    f"line `{item['code']}`"}})
    rules = [{"id": "new-race", "shortDescription": {"text": "A race the base does not have"}},
             {"id": "unreached-ordering-line", "shortDescription": {
                 "text": "A changed stream-ordering line no variant ran"}}]
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "overlap-harness", "rules": rules}},
                      "results": results}]}


def write_sarif(document: dict[str, Any], path: Path) -> None:
    """Write :func:`sarif` of ``document`` to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sarif(document), indent=1) + "\n")


__all__ = ["race_line", "sarif", "text", "write_sarif"]
