"""Trace-DSL helpers (CSAN style): run a short trace, then count the races computed."""

from __future__ import annotations

import torch

from model.trace import Race
from sim.device import SimDevice


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
