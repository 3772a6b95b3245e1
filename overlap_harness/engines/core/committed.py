"""What a committed engine report (reports/conformance/<engine>-<version>.json, written by a
tools/ script) needs from every engine: paths free of the machine that ran it, each race once
per signature, and the CPU time of the runs with the table's forked children."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.results import race_signature


def machine_free(value: Any, markers: Sequence[tuple[str, str]]) -> Any:
    """``value`` (a JSON-ready document) with every string that holds a path made relative:
    for the first ``(marker, keep)`` whose marker is in it, ``keep`` followed by what comes
    after the marker's last occurrence."""
    if isinstance(value, str):
        for marker, keep in markers:
            if marker in value:
                return keep + value.rsplit(marker, 1)[1]
        return value
    if isinstance(value, list):
        return [machine_free(item, markers) for item in value]
    if isinstance(value, dict):
        return {key: machine_free(item, markers) for key, item in value.items()}
    return value


def distinct_races(row: dict[str, Any]) -> dict[str, Any]:
    """A necessity row with each race once (the same pair of lines recurs every step);
    ``race_count`` counts them all."""
    unique: dict[tuple, dict] = {}
    for race in row["races"]:
        unique.setdefault(race_signature(race), race)
    return {**row, "race_count": len(row["races"]), "races": list(unique.values())}


def cpu_seconds_with_children() -> float:
    """CPU seconds of this process and of its waited-for children (the forked table runs)."""
    spent = os.times()
    return spent.user + spent.system + spent.children_user + spent.children_system


def write_report(document: dict[str, Any], page: str, out: Path, stem: str) -> Path:
    """``out/<stem>.json`` (``document``) and ``out/<stem>.md`` (``page``); returns the
    stem's path (the version's dots stay in the names)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / stem
    Path(f"{path}.json").write_text(json.dumps(document, indent=1) + "\n")
    Path(f"{path}.md").write_text(page)
    return path
