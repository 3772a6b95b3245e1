"""Races grouped by their pair of sites, so that a plot of many races stays readable.

A loop that races races once per iteration, and a run with one sync removed can race a
hundred times and more (138 races in ``s10_forward_entry_raw[forward_entry]``); a connector
per race drew a red tangle. Past :data:`MAX_SINGLE_RACES` races in view the timeline draws
one connector per pair of sites, at the group's first race, labelled with how many races it
stands for. The groups are :class:`overlap_harness.model.race_groups.RaceGroup`, the record
the text and JSON reports group by too.
"""

from __future__ import annotations

from collections.abc import Iterable

from overlap_harness.model.race_groups import RaceGroup, group_key, group_races
from overlap_harness.model.trace import Race

MAX_SINGLE_RACES = 8
"""Up to this many races in view, each gets its own connector; past it, one per site pair."""


def plotted_groups(races: Iterable[Race], limit: int = MAX_SINGLE_RACES) -> list[RaceGroup]:
    """What a plot draws for ``races`` (those in view): one group per race while there are
    at most ``limit`` of them, else one per pair of sites."""
    races = list(races)
    if len(races) <= limit:
        return [RaceGroup(group_key(race), [race]) for race in races]
    return group_races(races)
