"""Trace-DSL helpers (CSAN style): run a short trace, then count the races computed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from overlap_harness.model.config import ProtocolConfig, Timing, Workload
from overlap_harness.model.protocol import compare_runs, run_protocol
from overlap_harness.model.trace import Race
from overlap_harness.sim.sim_device import SimDevice


def races_of(dev: SimDevice) -> list[Race]:
    """Finish the run and return the races the detector computed."""
    return dev.finish().races


def assert_no_race(dev: SimDevice) -> None:
    """The detector found no race."""
    races = races_of(dev)
    assert races == [], "\n".join(r.describe() for r in races)


def assert_races(dev: SimDevice, n: int, *kinds: str) -> list[Race]:
    """The detector found exactly ``n`` races, of these kinds (in issue order)."""
    races = races_of(dev)
    assert len(races) == n, "\n".join(r.describe() for r in races)
    if kinds:
        assert [str(r.kind) for r in races] == list(kinds)
    return races


def ints(*v: int) -> torch.Tensor:
    """An int64 tensor: the value an op writes."""
    return torch.tensor(v, dtype=torch.int64)


@dataclass(frozen=True)
class Paired:
    """An overlapped protocol run beside its serial oracle."""

    outcome: Any
    observations: dict
    races: list[Race]
    diffs: list


def run_with_oracle(proto: ProtocolConfig, wl: Workload, removed: tuple[str, ...] = (),
                    delays: Mapping[tuple[str, int], float] | None = None) -> Paired:
    """Run the protocol overlapped and serially (the oracle must itself be race-free) and
    compare them value by value."""
    dev = SimDevice(removed=removed, delays=delays)
    out = run_protocol(dev, (proto, wl, Timing()))
    races = dev.finish().races
    odev = SimDevice(removed=removed, serial=True)
    o_out = run_protocol(odev, (proto, wl, Timing()))
    assert odev.finish().races == []
    return Paired(out, dev.observations, races,
                  compare_runs(out, dev.observations, o_out, odev.observations))
