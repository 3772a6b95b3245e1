"""Both outcomes of every branching ``query()``: the race set of a program with branches.

A ``query()`` used as a branch (not a poll loop) answers True or False by timing; the two
branches can issue different work, so each outcome can have races the other lacks
(STREAM-SEMANTICS.md, "Program edges and observations"). The simulator answers False unless a
run forces True, so one run covers one outcome per query, whatever the timing. This module
explores the others: starting from the default run it forces, one site at a time, the outcome
not yet seen, breadth first (a site that only exists inside a branch is found by the run that
takes that branch), up to ``max_runs`` runs. The report is the union of the races; a race that
does not appear under every outcome of some site names the outcome it needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from overlap_harness.model.trace import QuerySite, Race

QueryKey = tuple[str, int, int]
Outcomes = Mapping[QueryKey, bool]
#: runs the program with these forced outcomes; returns its races and the queries it made
ProgramRun = Callable[[Outcomes], tuple[list[Race], list[QuerySite]]]


def race_identity(race: Race) -> tuple:
    """A race's identity across runs: kind, buffers, both ops and iterations, elements."""
    return (str(race.kind), race.buffer, race.reused_as, race.first.op_name,
            race.first.iteration, race.second.op_name, race.second.iteration, race.elements)


@dataclass
class OutcomeReport:
    """Every explored assignment of query outcomes and the union of their races."""

    assignments: list[dict[QueryKey, bool]] = field(default_factory=list)
    sites: dict[QueryKey, QuerySite] = field(default_factory=dict)
    races: list[Race] = field(default_factory=list)
    truncated: bool = False  # ``max_runs`` stopped the search before it was complete


def explore_outcomes(run: ProgramRun, max_runs: int = 64) -> OutcomeReport:
    """Run ``run`` under the default outcomes and then under each other outcome of each
    query site reached, breadth first; see the module docstring."""
    report = OutcomeReport()
    seen: dict[tuple, list[tuple[Race, dict[QueryKey, bool]]]] = {}
    queue: list[dict[QueryKey, bool]] = [{}]
    tried: set[frozenset[QueryKey]] = {_signature({})}
    while queue:
        forced = queue.pop(0)
        if len(report.assignments) == max_runs:
            report.truncated = True
            break
        races, sites = run(forced)
        actual = {site.key: site.outcome for site in sites}
        report.assignments.append(actual)
        for site in sites:
            report.sites.setdefault(site.key, site)
        for race in races:
            seen.setdefault(race_identity(race), []).append((race, actual))
        for site in sites:
            flipped = {**forced, site.key: not site.outcome}
            signature = _signature(flipped)
            if signature not in tried:
                tried.add(signature)
                queue.append(flipped)
    for found in seen.values():
        race, _ = found[0]
        needs = _needs([a for _r, a in found], report.assignments, report.sites)
        report.races.append(dataclasses.replace(race, needs=needs))
    return report


def _signature(forced: Outcomes) -> frozenset[QueryKey]:
    """What a forced assignment runs: the sites forced True (False is every site's default,
    so forcing False is the same run as not forcing)."""
    return frozenset(key for key, value in forced.items() if value)


def _needs(present: list[dict[QueryKey, bool]], every: list[dict[QueryKey, bool]],
           sites: dict[QueryKey, QuerySite]) -> tuple[str, ...]:
    """The site outcomes a race needs: those every run that had it agrees on, where some
    explored run with the other outcome of that site did not have it."""
    needs = []
    for key, site in sites.items():
        values = {a.get(key) for a in present}
        if len(values) != 1 or None in values:
            continue
        (value,) = values
        if any(a.get(key) == (not value) for a in every):
            needs.append(dataclasses.replace(site, outcome=bool(value)).describe())
    return tuple(sorted(needs))
