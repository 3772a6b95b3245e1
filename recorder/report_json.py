"""The JSON form of a watched program's races and notes (``overlap-harness check --json``).

Each entry of ``races`` is one pair of racing sites (:mod:`recorder.race_groups`), however
many times it raced::

    {"kind": "host-D2H", "description": "D2H copy vs host read", "direction": "D2H",
     "tensor": "host_out@prog.py:7", "allocated_at": "prog.py:7", "reused_as": null,
     "shape": [4], "elements": [[0, 4]], "element_count": 4, "count": 1,
     "first": {"file", "line", "op", "stream", "mode", "iterations"}, "second": {...}}

``kind`` is the detector's (RAW, WAR, WAW, host-D2H, reuse); ``description`` says it in words
and, for host-memory races, which way the copy went and what the host did; ``direction`` is
``D2H`` or ``H2D`` for those, else null. ``elements`` are half-open ``[start, stop)`` runs of
flat element ids, ``element_count`` how many. ``iterations`` of an access is null outside
every loop, else ``{"first": mark, "last": mark}``, a mark being ``{"named": <the program's
iteration(i)> or null, "loops": [{"file", "line", "count"}, ...]}`` (outermost loop first,
``count`` from 0). ``notes`` lists the portability notes (not races) with how many times
each was seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from overlap_harness.model.trace import Access, Race
from overlap_harness.recorder.iterations import IterationMark
from overlap_harness.recorder.race_groups import (
    RaceGroup,
    element_ranges,
    group_races,
    host_direction,
    kind_description,
    side_marks,
)
from overlap_harness.recorder.report_text import MarkOf, marks_lookup
from overlap_harness.recorder.sites import split_site


def access_json(access: Access, marks: Sequence[IterationMark]) -> dict[str, Any]:
    """One side of a race: file, line, op, stream, mode, iterations."""
    file, line = split_site(access.source)
    iterations = ({"first": marks[0].as_json(), "last": marks[-1].as_json()}
                  if marks else None)
    return {"file": file, "line": line, "op": access.op_name, "stream": access.agent,
            "mode": access.mode, "iterations": iterations}


def group_json(group: RaceGroup, sites: Mapping[str, str], mark_of: MarkOf) -> dict[str, Any]:
    """One pair of racing sites (see the module docstring)."""
    race = group.race
    ranges = element_ranges(group.elements())
    return {"kind": str(race.kind), "description": kind_description(race),
            "direction": host_direction(race), "tensor": race.buffer,
            "allocated_at": sites.get(race.buffer), "reused_as": race.reused_as,
            "shape": list(race.shape), "elements": [list(r) for r in ranges],
            "element_count": sum(b - a for a, b in ranges), "count": group.count,
            "first": access_json(race.first, side_marks(group, "first", mark_of)),
            "second": access_json(race.second, side_marks(group, "second", mark_of))}


def races_json(races: Sequence[Race], sites: Mapping[str, str],
               marks: Mapping[int, IterationMark]) -> list[dict[str, Any]]:
    """Every pair of racing sites as JSON."""
    mark_of = marks_lookup(marks)
    return [group_json(g, sites, mark_of) for g in group_races(races)]


def notes_json(notes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every distinct portability note, with how many times it was seen."""
    seen: dict[tuple, dict[str, Any]] = {}
    for note in notes:
        entry = seen.get(note.key)
        if entry is not None:
            entry["count"] += 1
            continue
        file, line = split_site(note.site)
        seen[note.key] = {"kind": "pageable-nonblocking-copy", "direction": note.direction,
                          "tensor": note.host_tensor, "device_tensor": note.device_tensor,
                          "stream": note.stream, "file": file, "line": line, "count": 1,
                          "text": note.describe()}
    return list(seen.values())
