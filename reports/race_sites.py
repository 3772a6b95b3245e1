"""Races grouped by their pair of sites, so that a plot of many races stays readable.

A loop that races races once per iteration, and a run with one sync removed can race a
hundred times and more (138 races in ``s10_forward_entry_raw[forward_entry]``); a connector
per race drew a red tangle. Past :data:`MAX_SINGLE_RACES` races in view the timeline draws
one connector per pair of sites (:class:`SiteGroup`: same kind, buffer, and for both
accesses the same source line, agent and mode), at the group's first race in view, labelled
with how many races it stands for. The text reports group alike (``recorder/race_groups.py``
for ``check``); this module is the plots' own, as ``reports`` reads result records only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from overlap_harness.model.trace import Race

MAX_SINGLE_RACES = 8
"""Up to this many races in view, each gets its own connector; past it, one per site pair."""

SiteKey = tuple[str, str, str, str, str, str, str, str]


def site_key(race: Race) -> SiteKey:
    """What the races of one group share: kind, buffer, and both accesses' source line,
    agent and mode (the elements and iterations differ from race to race)."""
    a, b = race.first, race.second
    return (str(race.kind), race.buffer, a.source, a.agent, a.mode, b.source, b.agent, b.mode)


@dataclass(slots=True)
class SiteGroup:
    """The races between one pair of sites, in the order given."""

    key: SiteKey
    races: list[Race] = field(default_factory=list)

    @property
    def race(self) -> Race:
        """The first of them: the one the plot draws."""
        return self.races[0]

    @property
    def count(self) -> int:
        """How many races the group stands for."""
        return len(self.races)

    @property
    def manifest(self) -> bool | None:
        """True if any of them was manifest, False if all were latent, None if unknown."""
        states = {r.manifest for r in self.races}
        return True if True in states else (False if states == {False} else None)


def group_by_sites(races: Iterable[Race]) -> list[SiteGroup]:
    """``races`` grouped by :func:`site_key`, groups in the order of their first race."""
    groups: dict[SiteKey, SiteGroup] = {}
    for race in races:
        key = site_key(race)
        group = groups.get(key)
        if group is None:
            group = groups[key] = SiteGroup(key)
        group.races.append(race)
    return list(groups.values())


def plotted_groups(races: Iterable[Race], limit: int = MAX_SINGLE_RACES) -> list[SiteGroup]:
    """What a plot draws for ``races`` (those in view): one group per race while there are
    at most ``limit`` of them, else one per pair of sites."""
    races = list(races)
    if len(races) <= limit:
        return [SiteGroup(site_key(r), [r]) for r in races]
    return group_by_sites(races)
