"""Exploration on toy programs: a latent race is made manifest, then shrunk."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from overlap_harness.explore import Trial, explore, inverting_delay, shrink
from overlap_harness.sim.sim_device import SimDevice


def toy(delays: Mapping[tuple[str, int], float], jitter: float, seed: int,
        synced: bool = False) -> Trial:
    """F reads a row S writes, unordered; the read is late enough that the race is latent."""
    dev = SimDevice(host_launch_us=1.0, delays=delays, jitter=jitter, seed=seed)
    s, f = dev.stream("schedule"), dev.stream("forward")
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    dev.launch(s, "write", lambda: torch.tensor([5]), writes=[(b, [1])], cost_us=10)
    dev.launch(s, "other", lambda: torch.tensor([6]), writes=[(b, [2])], cost_us=10)
    if synced:
        dev.wait_stream(f, s)
    dev.launch(f, "busy", lambda: (), cost_us=100)
    dev.launch(f, "read", lambda v: (), reads=[(b, [1, 2])], cost_us=1)
    run = dev.finish()
    return Trial(run.races, any(r.manifest for r in run.races))


def test_a_latent_race_is_made_manifest_by_one_targeted_delay() -> None:
    base = toy({}, 0.0, 0)
    assert base.races and not base.manifest
    ex = explore(toy, budget=16)
    assert ex.manifest and ex.source == "targeted"
    assert ex.shrunk is not None and len(ex.shrunk) == 1
    assert toy(ex.shrunk, 0.0, 0).manifest  # the shrunk schedule replays


def test_inverting_delay_covers_the_gap() -> None:
    (race, *_) = toy({}, 0.0, 0).races
    ((key, us),) = inverting_delay(race).items()
    assert key == (race.first.op_name, -1)
    assert us * 1000 > race.second.time_ns - race.first.time_ns


def test_shrink_drops_every_delay_that_is_not_needed() -> None:
    needed = ("write", -1)
    big = {needed: 500.0, ("other", -1): 1.0, ("busy", -1): 3.0}
    assert shrink(big, lambda d: needed in d) == {needed: 500.0}


def test_a_race_free_program_never_manifests() -> None:
    ex = explore(lambda d, j, s: toy(d, j, s, synced=True), budget=8)
    assert not ex.manifest and ex.tried == 1  # no race: nothing to target
