"""The pieces of a report, on races built by hand: host-memory kinds by direction (issue
order, any host thread), element ranges, pairs of sites collapsed with each side's first and
last iteration."""

from __future__ import annotations

from overlap_harness.model.trace import Access, Race, RaceKind
from overlap_harness.recorder.iterations import IterationMark, LoopPass
from overlap_harness.recorder.race_groups import (
    describe_elements,
    describe_ranges,
    element_ranges,
    group_races,
    host_direction,
    kind_description,
)
from overlap_harness.recorder.report_text import describe_group


def access(op: int, agent: str, mode: str, line: int, name: str = "copy_") -> Access:
    return Access(op, name, agent, "buf@p.py:1", mode, -1, f"p.py:{line}")


def race(kind: RaceKind, first: Access, second: Access, elements=(0, 1, 2, 3)) -> Race:
    return Race(kind, "buf@p.py:1", (4,), tuple(elements), first, second)


def test_host_memory_races_are_named_by_direction_and_host_side_in_issue_order() -> None:
    cases = [
        (access(1, "side", "write", 5), access(2, "host", "read", 6)),  # D2H then host read
        (access(1, "host", "write", 5), access(2, "side", "read", 6)),  # host fill, H2D
        (access(1, "side", "read", 5), access(2, "thread loader", "write", 6)),
        (access(1, "thread loader", "read", 5), access(2, "side", "write", 6)),
    ]
    words = [(kind_description(race(RaceKind.HOST_D2H, a, b)),
              host_direction(race(RaceKind.HOST_D2H, a, b))) for a, b in cases]
    assert words == [("D2H copy vs host read", "D2H"), ("host write vs H2D copy", "H2D"),
                     ("H2D copy vs host write", "H2D"), ("host read vs D2H copy", "D2H")]
    stream_race = race(RaceKind.RAW, access(1, "side", "write", 5), access(2, "default",
                                                                          "read", 6))
    assert host_direction(stream_race) is None


def test_elements_as_ranges() -> None:
    assert element_ranges([9, 0, 1, 2, 3, 8, 2]) == [(0, 4), (8, 10)]
    assert describe_ranges([(0, 1024), (2048, 2051)]) == "0-1023, 2048-2050"
    assert describe_ranges([(i * 2, i * 2 + 1) for i in range(10)], limit=3) == (
        "0, 2, 4, and 7 more runs")
    assert describe_elements([0, 1, 2, 3], (2, 2)) == "elements 0-3 (all 4)"
    assert describe_elements([1, 3], (4,)) == "elements 1, 3 (2 of 4)"


def test_a_pair_of_sites_racing_in_every_iteration_is_one_paragraph() -> None:
    races, marks = [], {}
    for step in range(4):
        write, read = access(10 * step, "side", "write", 9, "add_"), access(
            10 * step + 1, "default", "read", 12, "sum")
        races.append(race(RaceKind.RAW, write, read))
        for a in (write, read):
            marks[a.op] = IterationMark((LoopPass("p.py", 7, step),))
    other = race(RaceKind.WAR, access(50, "default", "read", 12, "sum"),
                 access(51, "side", "write", 9, "add_"))
    groups = group_races([*races, other])
    assert [g.count for g in groups] == [4, 1]
    assert describe_group(groups[0], {"buf@p.py:1": "p.py:1"},
                          lambda a: marks.get(a.op)) == (
        "RAW race on buf (allocated at p.py:1), elements 0-3 (all 4), 4 times\n"
        "  first:  write by add_ on stream side at p.py:9, iterations 0 to 3 of the loop at "
        "line 7\n"
        "  second: read by sum on stream default at p.py:12, iterations 0 to 3 of the loop "
        "at line 7")
    assert describe_group(groups[1], {}, lambda a: None) == (
        "WAR race on buf@p.py:1, elements 0-3 (all 4)\n"
        "  first:  read by sum on stream default at p.py:12\n"
        "  second: write by add_ on stream side at p.py:9")
