"""Races grouped by their pair of sites: the one record every report and plot shares.

A loop that races races once per iteration, and a run with one sync removed can race a
hundred times and more. Reports print such a pair of sites once, and timeline plots draw
one connector for it: :class:`RaceGroup` holds every race of one pair (same kind, buffer,
reuse, and for both accesses the same source line, agent and mode; the elements and
iterations differ from race to race). The text and JSON reports
(``recorder/report_text.py``, ``recorder/report_json.py``) and the plots
(``reports/race_sites.py``) read it; it lives here, below both, so they share one record.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from overlap_harness.model.trace import Race

GroupKey = tuple[str, str, str | None, str, str, str, str, str, str]


def group_key(race: Race) -> GroupKey:
    """What the races of one group share: kind, buffer, the buffer it was reused as, and both
    accesses' source line, agent and mode."""
    first, second = race.first, race.second
    return (str(race.kind), race.buffer, race.reused_as, first.source, first.agent,
            first.mode, second.source, second.agent, second.mode)


@dataclass(slots=True)
class RaceGroup:
    """Every race between one pair of sites, in the order found."""

    key: GroupKey
    races: list[Race] = field(default_factory=list)

    @property
    def race(self) -> Race:
        """The first of them: its kind, tensor and sites are the group's."""
        return self.races[0]

    @property
    def count(self) -> int:
        """How many times the pair raced."""
        return len(self.races)

    @property
    def manifest(self) -> bool | None:
        """True if any of them was manifest, False if all were latent, None if unknown."""
        states = {race.manifest for race in self.races}
        return True if True in states else (False if states == {False} else None)

    def elements(self) -> list[int]:
        """Every element any of them touched, sorted."""
        return sorted({element for race in self.races for element in race.elements})


def group_races(races: Iterable[Race]) -> list[RaceGroup]:
    """``races`` grouped by :func:`group_key`, groups in the order of their first race."""
    groups: dict[GroupKey, RaceGroup] = {}
    for race in races:
        key = group_key(race)
        group = groups.get(key)
        if group is None:
            group = groups[key] = RaceGroup(key)
        group.races.append(race)
    return list(groups.values())
