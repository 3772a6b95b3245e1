"""Turn a scenario into the runs it asks for: the base run plus one per ``[[mutation]]``.

Each run gets an id of the form ``<scenario>/<mutation or base>-<sha1[:8]>`` (vidur names
runs by a key plus a short hash): the hash covers everything that decides what the run does
(resolved protocol, workload, timing, exploration and seed, removed syncs) and nothing that
does not (names, description, file path, expectations), so equal ids mean equal runs.
``scenario_to_dict`` gives the resolved scenario as JSON-ready data to save beside reports.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from overlap_harness.model.config import Expect, Mutation, ProtocolConfig, Scenario

#: The mutation part of the base run's id.
BASE = "base"


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run of a scenario: the protocol it uses, the syncs it removes, what it expects."""

    scenario: Scenario
    mutation_name: str  # "" for the base run
    protocol: ProtocolConfig  # scenario.protocol with the mutation's overrides applied
    removed: frozenset[str]
    expect: Expect
    races: tuple[str, ...]
    run_id: str
    mutation_index: int = -1  # its [[mutation]] entry in the file; -1 for the base run
    allow_unused: bool = False  # the mutation may remove syncs this configuration never reaches


def to_data(value: Any) -> Any:
    """A config value as JSON-ready data: dataclasses to dicts, enums to their strings,
    tuples to lists (recursively)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list | frozenset | set):
        items = [to_data(v) for v in value]
        return sorted(items) if isinstance(value, frozenset | set) else items
    if isinstance(value, dict):
        return {str(k): to_data(v) for k, v in value.items()}
    return value


def scenario_to_dict(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario (every key, defaults filled in) as JSON-serialisable data."""
    return to_data(scenario)


def mutation_name(mutation: Mutation) -> str:
    """A mutation's name: its ``name``, else its removed labels joined by ``+``, else its
    overrides as ``key=value`` joined by ``+``."""
    if mutation.name:
        return mutation.name
    if mutation.remove:
        return "+".join(mutation.remove)
    return "+".join(f"{k}={_text(v)}" for k, v in sorted(mutation.set.items()))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value.value if isinstance(value, Enum) else value)


def _late_defaults(protocol: ProtocolConfig) -> set[str]:
    """Protocol keys marked ``late`` in model.config that are at their default: left out of
    the run id, so the runs that existed before those keys keep their ids."""
    return {f.name for f in dataclasses.fields(protocol)
            if f.metadata.get("late") and getattr(protocol, f.name) == f.default}


def _run_id(scenario: Scenario, name: str, protocol: ProtocolConfig,
            removed: frozenset[str]) -> str:
    behaviour = {
        "protocol": {k: v for k, v in to_data(protocol).items()
                     if k not in _late_defaults(protocol)},
        "workload": to_data(scenario.workload),
        "timing": to_data(scenario.timing),
        "explore": scenario.check.explore,
        "seed": scenario.check.seed,
        "removed": sorted(removed),
    }
    blob = json.dumps(behaviour, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha1(blob.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{scenario.name}/{name or BASE}-{digest}"


def expand(scenario: Scenario) -> list[RunSpec]:
    """The base run followed by one run per mutation, in file order.

    A mutation's ``set`` overrides are applied to the scenario's protocol with
    ``dataclasses.replace``; the loader has already validated them, so this raises only
    ``TypeError`` for a hand-built mutation naming a key ``ProtocolConfig`` lacks.
    """
    check = scenario.check
    none: frozenset[str] = frozenset()
    runs = [RunSpec(scenario, "", scenario.protocol, none, check.expect, check.races,
                    _run_id(scenario, "", scenario.protocol, none))]
    for index, m in enumerate(scenario.mutation):
        protocol = dataclasses.replace(scenario.protocol, **m.set)
        removed = frozenset(m.remove)
        name = mutation_name(m)
        runs.append(RunSpec(scenario, name, protocol, removed, m.expect, m.races,
                            _run_id(scenario, name, protocol, removed), index,
                            m.allow_unused))
    return runs
