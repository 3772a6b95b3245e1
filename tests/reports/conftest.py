"""Synthetic CaseResults for the report tests, built from real SimDevice runs.

The loop below is a small stand-in for the overlap scheduler (host prep, schedule stream,
forward, D2H relay of seq_lens), so the reports see the same kinds of entries a protocol run
produces without depending on ``model.protocol``. Removing
``publish_ready.schedule_wait`` makes the schedule stream gather seq_lens while the forward
still writes them: a RAW race per iteration after the first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from overlap_harness.model.device import SyncLabel
from overlap_harness.model.metrics import compute_metrics
from overlap_harness.model.results import CaseResult
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import ints

SCENARIO_TOML = """\
# a synthetic scenario file: the reports find lines in it
name = "synthetic_decode"
description = "stand-in for the overlap loop"

[check]
expect = "race_free"

[[mutation]]
name = "no_publish_wait"
remove = ["publish_ready.schedule_wait"]
expect = "race"
"""
REMOVED = "publish_ready.schedule_wait"


def simulate_loop(iterations: int, removed: tuple[str, ...] = ()) -> SimDevice:
    """Run the stand-in loop for ``iterations`` on a fresh SimDevice (5 µs launches)."""
    dev = SimDevice(removed, host_launch_us=5.0)
    s, f, d = dev.stream("schedule"), dev.stream("forward"), dev.stream("d2h")
    seq = dev.buffer("new_seq_lens_buf", (4,), torch.int64, fill=0)
    ids = dev.buffer("input_ids", (4, 8), torch.int64, fill=0)
    pinned = dev.buffer("new_seq_lens_cpu_pinned", (4,), torch.int64, pinned=True, fill=0)
    publish, read_done = dev.event("publish_ready"), dev.event("read_done")
    copy_done = dev.event("copy_done")
    for n in range(iterations):
        dev.iteration = n
        dev.host_work("schedule_prep", 300)
        dev.wait_event(s, read_done, SyncLabel.WAR_BARRIER)
        dev.wait_event(s, publish, SyncLabel.PUBLISH_READY_SCHEDULE_WAIT)
        dev.launch(s, "gather_seq_lens", lambda v: (), reads=[(seq, [0, 1])], cost_us=20)
        dev.launch(s, "prepare_inputs", lambda n=n: ints(n), writes=[(ids, [0, 1])], cost_us=60)
        dev.wait_stream(f, s, SyncLabel.FORWARD_ENTRY)
        dev.launch(f, "embed", lambda v: (), reads=[ids], cost_us=200)
        dev.record(read_done, f)
        dev.wait_event(f, copy_done)  # the last D2H copy has read new_seq_lens_buf
        dev.launch(f, "verify", lambda n=n: ints(n, n), writes=[(seq, [0, 1])], cost_us=1200)
        dev.record(publish, f)
        dev.launch(f, "draft", lambda: (), cost_us=600)
        # results of iteration n - 1 while the forward of n runs (the overlap)
        dev.host_work("process_results", 150)
        dev.synchronize(copy_done, SyncLabel.COPY_DONE_HOST_SYNC)
        dev.host_read(pinned, None, name="read_seq_lens")
        dev.wait_event(d, publish, SyncLabel.PUBLISH_READY_D2H_WAIT)
        dev.copy(d, seq, pinned, non_blocking=True, cost_us=10, name="d2h_seq_lens")
        dev.record(copy_done, d)
    return dev


def make_case(tmp_path: Path, iterations: int = 3, mutation: str = "") -> CaseResult:
    """A CaseResult of the stand-in loop: the base run, or the ``no_publish_wait`` mutation."""
    path = tmp_path / "synthetic_decode.toml"
    if not path.exists():
        path.write_text(SCENARIO_TOML)
    removed = (REMOVED,) if mutation else ()
    dev = simulate_loop(iterations, removed)
    run = dev.finish()
    expect = "race" if mutation else "race_free"
    verdict = "race" if run.races else "race_free"
    return CaseResult(
        run_id=f"synthetic_decode/{mutation or 'base'}-0123abcd", scenario="synthetic_decode",
        mutation=mutation, path=str(path), expect=expect, verdict=verdict,
        ok=verdict == expect, races=run.races, metrics=compute_metrics(run.timeline),
        removed=removed, skipped_syncs=run.skipped_syncs, timeline=run.timeline,
        config={"name": "synthetic_decode"})


@pytest.fixture
def base_case(tmp_path: Path) -> CaseResult:
    """The race-free base run, 3 iterations."""
    return make_case(tmp_path)


@pytest.fixture
def racy_case(tmp_path: Path) -> CaseResult:
    """The mutation without publish_ready.schedule_wait, 3 iterations: RAW races."""
    return make_case(tmp_path, mutation="no_publish_wait")
