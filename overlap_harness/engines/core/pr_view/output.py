"""A pull request's view as a reviewer reads it, and as SARIF.

Text: one verdict line per change, at most :data:`MAX_LINE` characters (the variants
summed up as a count and the first one; a move is one verdict, its removed half folded in),
then per change its new races, each in one sentence (which access on which stream can run
before or after which other) with the ordering that would fix it on a line of its own,
led by ``fix:``. Counts say what they count: a race is one racing pair of accesses of one
buffer (kind, buffer, both sides' code); its occurrences are how often it raced, over
iterations and variants. SARIF: one result per change and pair of racing sites, at the
change's line, both racing sites as related locations. Every path is relative to the tree
root; a side in the harness's stand-in code is shown at the tree's line that called it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the longest verdict line (characters)
MAX_LINE = 200
#: new races listed per change in the text (every one is in the JSON and the SARIF)
SHOWN_PER_CHANGE = 10


def plural(count: int, noun: str) -> str:
    """``1 race``, ``2 races``, ``3 occurrences``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def variants_phrase(variants: Sequence[str]) -> str:
    """``in non_spec_decode`` or ``in 30 variants, first non_spec_decode``."""
    if len(variants) == 1:
        return f"in {variants[0]}"
    return f"in {len(variants)} variants, first {variants[0]}"


def count_phrase(races: Sequence[dict[str, Any]], adjective: str = "new") -> str:
    """``365 new races (6627 occurrences)``: races, then how often they raced."""
    occurrences = sum(r.get("count", 1) for r in races)
    return f"{plural(len(races), f'{adjective} race')} ({plural(occurrences, 'occurrence')})"


def place(side: dict[str, Any]) -> str:
    """``FILE:LINE`` of a side in the tree: a side in the harness's stand-in code is placed at
    the tree's line that called into it."""
    stand_in = side.get("stands_in_for")
    if not side.get("in_tree", True) and stand_in:
        return f"{stand_in['file']}:{stand_in['line']}"
    return f"{side['file']}:{side['line']}"


def actor(side: dict[str, Any]) -> str:
    """``index_put_ on self.forward_stream (FILE:LINE)``; a stand-in says so."""
    stand_in = "" if side.get("in_tree", True) else ", the harness's stand-in"
    return f"{side['op']} on {side['stream']} ({place(side)}{stand_in})"


def _tensor(race: dict[str, Any]) -> str:
    return str(race["tensor"]).split("@", 1)[0]


def explanation(race: dict[str, Any]) -> str:
    """One sentence: which access on which stream can run before (or while) which other."""
    first, second, tensor = actor(race["first"]), actor(race["second"]), _tensor(race)
    kind = race["kind"]
    if kind == "RAW":
        return f"{second} reads {tensor} and can run before {first} has finished writing it."
    if kind == "WAR":
        return f"{second} writes {tensor} and can run before {first} has finished reading it."
    if kind == "WAW":
        return f"{second} writes {tensor} and can run before {first} has finished writing it."
    if kind == "reuse":
        return (f"{second} uses memory of {tensor} handed out again, and can run while "
                f"{first} may still use it.")
    return (f"{second} and {first} both access {tensor} ({kind}) with nothing ordering "
            "one after the other.")


def fix_hint(race: dict[str, Any]) -> str:
    """The ordering that would fix the race, led by ``fix:``: restore what the change removed
    or moved; else an event recorded after the first access and waited on before the
    second."""
    what = race.get("what", "")
    if what.startswith("removed `"):
        return f"fix: restore the removed {what.removeprefix('removed ')}"
    if what.startswith("moved `"):
        code, _, where = what.removeprefix("moved ").partition(" (from ")
        return f"fix: move {code} back to where BASE has it ({where.rstrip(')')})"
    first, second = race["first"], race["second"]
    waiter = "synchronize on it" if second["stream"] == "host" else \
        f"make {second['stream']} wait on it"
    return (f"fix: record an event on {first['stream']} after {first['op']} "
            f"({place(first)}) and {waiter} before {second['op']} ({place(second)})")


def race_line(race: dict[str, Any]) -> str:
    """One race's headline: kind, buffer, how often and in which variants."""
    return (f"{race['kind']} on {_tensor(race)}, "
            f"{plural(race.get('count', 1), 'occurrence')} "
            f"{variants_phrase(race.get('variants') or ['?'])}")


def _in_order(variants: Any, document: dict[str, Any]) -> list[str]:
    """``variants`` once each, in the order the document ran them."""
    order = {name: i for i, name in enumerate(document.get("variants", []))}
    return sorted(dict.fromkeys(variants), key=lambda name: order.get(name, len(order)))


def _fit(where: str, what: str, verdict: str) -> str:
    """``WHERE WHAT: VERDICT`` in at most :data:`MAX_LINE` characters: the change's code is
    shortened (``...``) when the line would be longer."""
    line = f"{where} {what}: {verdict}"
    if len(line) <= MAX_LINE:
        return line
    room = MAX_LINE - len(f"{where} : {verdict}") - 3
    return f"{where} {what[:max(0, room)]}...: {verdict}"[:MAX_LINE]


def _races_by_change(document: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    by_change: dict[int, list[dict[str, Any]]] = {}
    for race in document["races"]:
        by_change.setdefault(race.get("change_index", -1), []).append(race)
    return by_change


def verdict_lines(document: dict[str, Any]) -> list[str]:
    """One line per change (the removed half of a move has none: the move's line covers it)."""
    by_change = _races_by_change(document)
    lines = []
    for index, change in enumerate(document["changes"]):
        if change.get("part_of_move"):
            continue
        races = by_change.get(index, [])
        if races:
            variants = _in_order((v for r in races for v in r["variants"]), document)
            verdict = f"{count_phrase(races)} {variants_phrase(variants)}"
        elif change["reached_by"]:
            ran = _in_order(change["reached_by"], document)
            verdict = f"no new race (run {variants_phrase(ran)})"
        elif change["executable"]:
            verdict = "NOT RUN by any variant"
        else:
            verdict = "no statement changed"
        lines.append(_fit(f"{change['file']}:{change['lines'][0]}", change["what"], verdict))
    return lines


def text(document: dict[str, Any]) -> list[str]:
    """The report's lines: the verdict per change, then per change its new races (each with
    its fix), the races fixed, the necessity changes, the unreached lines and the variants a
    tree cannot drive."""
    lines = verdict_lines(document)
    by_change = _races_by_change(document)
    for _index, races in sorted(by_change.items(), key=lambda item: item[0]):
        change = races[0].get("change", "") or "no change"
        ranked = sorted(races, key=lambda r: (-len(r["variants"]), -r.get("count", 1)))
        shown = ranked[:SHOWN_PER_CHANGE]
        more = (f"; below the {len(shown)} seen in most variants, every one in --json and "
                "--sarif" if len(races) > len(shown) else "")
        lines.append(f"new races of the change at {change}: {count_phrase(races)}{more}")
        for race in shown:
            lines.append(f"  {race_line(race)}:")
            lines.append(f"    {explanation(race)}")
            lines.append(f"    {fix_hint(race)}")
    if document["races_fixed"]:
        lines.append(f"races fixed (in BASE, gone in HEAD: "
                     f"{count_phrase(document['races_fixed'], 'fixed')}):")
        for race in document["races_fixed"][:SHOWN_PER_CHANGE]:
            lines.append(f"  {race_line(race)}:")
            lines.append(f"    was: {explanation(race)}")
        if len(document["races_fixed"]) > SHOWN_PER_CHANGE:
            lines.append(f"  ... and {len(document['races_fixed']) - SHOWN_PER_CHANGE} more "
                         "in --json")
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


def _location(place_: str, message: str | None = None, id_: int | None = None
              ) -> dict[str, Any]:
    file, _, line = place_.rpartition(":")
    out: dict[str, Any] = {"physicalLocation": {
        "artifactLocation": {"uri": file},
        "region": {"startLine": max(1, int(line)) if line.isdigit() else 1}}}
    if message is not None:
        out["message"] = {"text": message}
    if id_ is not None:
        out["id"] = id_
    return out


def sarif(document: dict[str, Any]) -> dict[str, Any]:
    """The new races (one result per change and pair of racing sites, at the change's line,
    the two sites related) and the unreached ordering lines, as SARIF 2.1.0."""
    pairs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for race in document["races"]:
        key = (race["change"], place(race["first"]), place(race["second"]))
        pairs.setdefault(key, []).append(race)
    results = []
    for (change, first_at, second_at), races in pairs.items():
        race = races[0]
        variants = _in_order((v for r in races for v in r["variants"]), document)
        buffers = ", ".join(dict.fromkeys(_tensor(r) for r in races))
        text_ = (f"{race['what']}: {count_phrase(races)} {variants_phrase(variants)} "
                 f"on {buffers}. {explanation(race)} {fix_hint(race)}")
        results.append({
            "ruleId": "new-race", "level": "error",
            "locations": [_location(change or second_at)],
            "relatedLocations": [
                _location(first_at, f"first: {race['first']['op']} on "
                          f"{race['first']['stream']}", 1),
                _location(second_at, f"second: {race['second']['op']} on "
                          f"{race['second']['stream']}", 2)],
            "message": {"text": text_}})
    for item in document["unreached"]:
        results.append({"ruleId": "unreached-ordering-line", "level": "warning",
                        "locations": [_location(f"{item['file']}:{item['line']}")],
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


__all__ = ["count_phrase", "explanation", "fix_hint", "race_line", "sarif", "text",
           "verdict_lines", "write_sarif"]
