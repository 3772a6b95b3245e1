"""The text report of a watched program's races, for a person.

One paragraph per pair of racing sites (:mod:`recorder.race_groups`)::

    RAW race on staged (allocated at prog.py:6), elements 0-5 (all 6)
      first:  write by mul_ on stream side at prog.py:9
      second: read by sum on stream default at prog.py:12

A pair that raced in many iterations says how many times, and each side the first and last
iteration it raced in (``iterations 0 to 9 of the loop at line 18``; a loop's iteration is
counted from its header line, :mod:`recorder.iterations`); an access outside every loop says
nothing about iterations. Portability notes (:mod:`recorder.pageable`) follow as ``note:``
lines, repeats collapsed the same way. Words only: the recorder does not time ops, so a race
is reported as possible under some timing, without a latent/manifest label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from overlap_harness.model.trace import Access, Race
from overlap_harness.recorder.iterations import IterationMark
from overlap_harness.recorder.race_groups import (
    HOST,
    RaceGroup,
    describe_elements,
    group_races,
    is_host,
    kind_title,
    side_marks,
)

MarkOf = Callable[[Access], IterationMark | None]


def _no_mark(access: Access) -> IterationMark | None:
    return None


def marks_lookup(marks: Mapping[int, IterationMark]) -> MarkOf:
    """``mark_of(access)`` from a node id -> mark table (``CheckResult.marks``)."""
    return lambda access: marks.get(access.op)


def tensor_phrase(label: str, sites: Mapping[str, str]) -> str:
    """``staged (allocated at prog.py:6)`` for ``staged@prog.py:6``."""
    variable = label.split("@", 1)[0]
    site = sites.get(label)
    return f"{variable} (allocated at {site})" if site else label


def agent_phrase(agent: str) -> str:
    """``stream side``, ``the host``, or a host thread as named (``thread loader``)."""
    if agent == HOST:
        return "the host"
    return agent if is_host(agent) else f"stream {agent}"


def describe_marks(marks: Sequence[IterationMark], near_file: str | None) -> str:
    """The iterations a side raced in: one, or the first and last (``iterations 0 to 9 of
    the loop at line 18``); empty when it raced outside every loop."""
    if not marks:
        return ""
    first, last = marks[0], marks[-1]
    if len(marks) == 1:
        return first.describe(near_file)
    if first.named is not None and last.named is not None:
        return f"iterations {first.named} to {last.named}"
    headers = [p.line for p in first.loops]
    if first.named is None and last.named is None and headers == [p.line for p in last.loops]:
        where = [p.describe(near_file).split(" of ", 1)[1] for p in first.loops]
        if len(headers) == 1:
            return f"iterations {first.loops[0].count} to {last.loops[0].count} of {where[0]}"
        start = ", ".join(str(p.count) for p in first.loops)
        stop = ", ".join(str(p.count) for p in last.loops)
        lines = ", ".join(w.removeprefix("the loop at ") for w in where)
        return f"iterations ({start}) to ({stop}) of the loops at {lines}"
    return f"from {first.describe(near_file)} to {last.describe(near_file)}"


def access_line(access: Access, marks: Sequence[IterationMark]) -> str:
    """``write by mul_ on stream side at prog.py:9, iteration 2 of the loop at line 8``."""
    where = f" at {access.source}" if access.source else ""
    file = access.source.rpartition(":")[0] or None
    iterations = describe_marks(marks, file)
    tail = f", {iterations}" if iterations else ""
    return f"{access.mode} by {access.op_name} on {agent_phrase(access.agent)}{where}{tail}"


def describe_group(group: RaceGroup, sites: Mapping[str, str], mark_of: MarkOf = _no_mark
                   ) -> str:
    """One race paragraph (see the module docstring)."""
    race = group.race
    tensor = tensor_phrase(race.buffer, sites)
    reused = f", reused as {tensor_phrase(race.reused_as, sites)}" if race.reused_as else ""
    times = f", {group.count} times" if group.count > 1 else ""
    head = (f"{kind_title(race)} race on {tensor}{reused}, "
            f"{describe_elements(group.elements(), race.shape)}{times}")
    first = access_line(race.first, side_marks(group, "first", mark_of))
    second = access_line(race.second, side_marks(group, "second", mark_of))
    return f"{head}\n  first:  {first}\n  second: {second}"


def describe_races(races: Sequence[Race], sites: Mapping[str, str],
                   mark_of: MarkOf = _no_mark) -> list[str]:
    """Every race paragraph, repeats collapsed."""
    return [describe_group(g, sites, mark_of) for g in group_races(races)]


def note_lines(notes: Sequence[Any]) -> list[str]:
    """``note: ...`` per distinct portability note, with how many times it was seen."""
    counts: dict[tuple, list[Any]] = {}
    for note in notes:
        counts.setdefault(note.key, []).append(note)
    lines = []
    for seen in counts.values():
        times = f" ({len(seen)} times)" if len(seen) > 1 else ""
        lines.append(f"note: {seen[0].describe()}{times}")
    return lines


def summary_line(script: str, races: Sequence[Race], notes: Sequence[Any], mode: str,
                 ops: int) -> str:
    """``prog.py: 12 races (3 pairs of sites; cpu mode, 20 ops recorded)``."""
    n = len(races)
    pairs = len(group_races(races))
    head = f"{script}: {n} race{'s' if n != 1 else ''}"
    details = []
    if pairs != n:
        details.append(f"{pairs} pair{'s' if pairs != 1 else ''} of sites")
    if notes:
        details.append(f"{len(notes)} portability note{'s' if len(notes) != 1 else ''}")
    where = f"{mode} mode, {ops} ops recorded"
    return f"{head} ({'; '.join([*details, where]) if details else where})"


def report_lines(result: Any) -> list[str]:
    """The race paragraphs and notes of a :class:`recorder.CheckResult` (or a finished
    :class:`recorder.Watch` with ``buffer_sites``, ``marks`` and ``notes``)."""
    mark_of = marks_lookup(result.marks)
    return [*describe_races(result.races, result.buffer_sites, mark_of),
            *note_lines(result.notes)]
