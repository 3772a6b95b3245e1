"""Races as a person reads them: repeats collapsed, element sets as ranges, kinds in words.

A loop that races races once per iteration; the reports print such a pair of sites once
(:class:`overlap_harness.model.race_groups.RaceGroup`, shared with the plots), with how
many times it raced and the first and last iteration of each side. Element sets are ranges
(``0-1023, 2048-2050``), and the race kind the detector calls ``host-D2H`` (the host and a
copy touching pinned memory unordered) is said by direction and by what the host did:
``D2H copy vs host read``, ``host write vs H2D copy`` (in issue order). The machine kind
stays ``host-D2H`` in JSON (``kind``) for the scenario files and tools that read it; the words
go in ``description``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from overlap_harness.model.race_groups import RaceGroup, group_key, group_races
from overlap_harness.model.trace import Access, Race, RaceKind
from overlap_harness.recorder.iterations import IterationMark

__all__ = ["RaceGroup", "group_key", "group_races", "side_marks"]  # the record is model's

HOST = "host"  # the detector's name of the host agent (the thread that entered the watch)
HOST_THREAD = "thread "  # other host threads' agents: ``thread NAME`` (no variable has a space)


def is_host(agent: str) -> bool:
    """True for a host agent (the main host, or another Python thread), not a stream."""
    return agent == HOST or agent.startswith(HOST_THREAD)

KIND_WORDS = {
    RaceKind.RAW: "a write and a later read, unordered: the read may see the old value",
    RaceKind.WAR: "a read and a later write, unordered: the write may clobber it first",
    RaceKind.WAW: "two writes, unordered: the final value depends on timing",
    RaceKind.REUSE: "the allocator handed the memory on while a stream may still use it",
}


def side_marks(group: RaceGroup, side: str, mark_of: Callable[[Access], IterationMark | None]
               ) -> list[IterationMark]:
    """The iterations of one side (``"first"`` or ``"second"``) of a group's races, by issue
    order, repeats collapsed."""
    accesses = sorted((getattr(race, side) for race in group.races), key=lambda a: a.op)
    out: list[IterationMark] = []
    for access in accesses:
        mark = mark_of(access)
        if mark is not None and (not out or out[-1] != mark):
            out.append(mark)
    return out


def element_ranges(elements: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct element ids as half-open ``[start, stop)`` runs."""
    out: list[tuple[int, int]] = []
    for e in sorted(set(elements)):
        if out and out[-1][1] == e:
            out[-1] = (out[-1][0], e + 1)
        else:
            out.append((e, e + 1))
    return out


def describe_ranges(ranges: Sequence[tuple[int, int]], limit: int = 8) -> str:
    """``0-1023, 2048-2050`` (inclusive ends, as a person counts), at most ``limit`` runs."""
    parts = [f"{a}" if b == a + 1 else f"{a}-{b - 1}" for a, b in ranges[:limit]]
    if len(ranges) > limit:
        parts.append(f"and {len(ranges) - limit} more runs")
    return ", ".join(parts)


def describe_elements(elements: Sequence[int], shape: Sequence[int]) -> str:
    """``elements 0-5 (all 6)`` or ``elements 0-3, 8 (5 of 16)``."""
    ranges = element_ranges(elements)
    count = sum(b - a for a, b in ranges)
    total = math.prod(shape) if shape else 0
    of = f"all {total}" if count == total else f"{count} of {total}" if total else f"{count}"
    return f"elements {describe_ranges(ranges)} ({of})"


def host_direction(race: Race) -> str | None:
    """``"D2H"`` or ``"H2D"`` for a host-memory race: which way the racing copy went (it
    writes the pinned buffer, or reads it); None for the other kinds."""
    if race.kind != RaceKind.HOST_D2H:
        return None
    copy = race.second if is_host(race.first.agent) else race.first
    return "D2H" if copy.mode == "write" else "H2D"


def kind_description(race: Race) -> str:
    """The race kind in words: ``D2H copy vs host read`` for a host-memory race (its two
    accesses in issue order), else what the kind means."""
    direction = host_direction(race)
    if direction is None:
        return KIND_WORDS[race.kind]
    sides = []
    for access in (race.first, race.second):
        if is_host(access.agent):
            sides.append(f"host {access.mode}")
        else:
            sides.append(f"{direction} copy")
    return " vs ".join(sides)


def kind_title(race: Race) -> str:
    """The kind as a report's headline says it: ``RAW``, or ``host-memory (D2H copy vs
    host read)``."""
    if race.kind == RaceKind.HOST_D2H:
        return f"host-memory ({kind_description(race)})"
    return str(race.kind)
