"""An attention-DP rank of SGLang's real overlap loop beside a scripted peer (variant
idle_dp_rank), and the strict fake of the DP sync-row gather.

The loop runs in a child process (SGLang imported once there): race-free as released, its
idle batches and graph replays as the peer's script decides them, one gather per iteration;
removing the idle result's host wait is redundant, removing the forward stream's wait on the
schedule stream races (the intact loop is its fixed twin). The fake's strictness needs no
SGLang: an unplanned group, a second gather in one iteration, an iteration past the script,
any other torch.distributed collective, each raise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.strict import UnplannedUseError
from overlap_harness.engines.sglang.features import dp_attention
from overlap_harness.engines.sglang.stand_ins.dp_peer import IDLE, PeerStep, ScriptedPeerGroup

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
from overlap_harness.engines.core.mutation import Coverage, remove_site
from overlap_harness.engines.core.necessity import forked_map
from overlap_harness.engines.sglang import environment
from overlap_harness.engines.sglang.report.path_sites import path_sites
environment.load()
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS

def run():
    r = run_variant(VARIANTS["idle_dp_rank"])
    return {"races": [f"{x.kind} {x.buffer}" for x in r.races], "launched": r.worker.launched,
            "iterations": r.iterations, "unknown_ops": r.unknown_ops}

def without(removal):  # in a forked child: the mutation dies with it
    name, function, piece = removal
    site = next(s for s in path_sites() if s.function.endswith(function) and piece in s.code)
    coverage = Coverage()
    remove_site(site, coverage)
    return name, {**run(), "reached": coverage.reached.get(site.key, 0)}

removals = json.loads(sys.argv[1])
print(json.dumps({"intact": run(), **dict(forked_map(without, removals, 1))}))
"""

REMOVALS = [("idle_host_wait", "process_batch_result_idle", "copy_done.synchronize()"),
            ("forward_wait", "run_batch", "forward_stream.wait_stream(self.schedule_stream)")]


@pytest.fixture(scope="module")
def runs() -> dict:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(REMOVALS)],
                          capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.engine_run
def test_the_dp_rank_as_released_is_race_free(runs):
    intact = runs["intact"]
    assert intact["races"] == [] and intact["unknown_ops"] == []
    assert intact["iterations"] == 14


@pytest.mark.engine_run
def test_idle_batches_and_graph_replays_follow_the_peer(runs):
    """Idle while only the peer has tokens: eager while it prefills (iterations 0, 3), a
    decode-graph replay while it decodes; the rank's own decode runs eager when the peer
    prefills (iteration 7); nothing at all when both are idle."""
    launched = [tuple(x) for x in runs["intact"]["launched"]]
    assert launched == [
        ("IDLE", 0, False), ("IDLE", 0, True), ("IDLE", 0, True), ("IDLE", 0, False),
        ("IDLE", 0, True), ("EXTEND", 1, False), ("DECODE", 1, True), ("DECODE", 1, False),
        ("IDLE", 0, True), ("EXTEND", 1, False), ("DECODE", 1, True), ("IDLE", 0, True)]


@pytest.mark.engine_run
def test_the_idle_result_wait_runs_and_is_redundant(runs):
    run = runs["idle_host_wait"]
    idle = [x for x in runs["intact"]["launched"] if x[0] == "IDLE"]
    assert run["reached"] == len(idle) == 7  # one per idle batch
    assert run["races"] == []


@pytest.mark.engine_run
def test_without_the_forward_wait_the_dp_rank_races(runs):
    run = runs["forward_wait"]
    assert run["reached"] == 12
    assert any(r.startswith("RAW ") for r in run["races"]), run["races"]


# --- the strict fake, without SGLang ---------------------------------------------------------

def _group(script: dict[int, PeerStep], now: list[int]) -> ScriptedPeerGroup:
    return ScriptedPeerGroup(script, last_iteration=3, clock=lambda: now[0])


def test_the_group_refuses_what_it_did_not_plan():
    now = [0]
    group = _group({}, now)
    local, out = torch.zeros(11, dtype=torch.int64), torch.zeros(22, dtype=torch.int64)
    with pytest.raises(UnplannedUseError, match="get_world_size"):
        group.get_world_size(object())
    assert group.get_world_size(group) == 2
    with pytest.raises(UnplannedUseError, match="only a blocking gather"):
        group.all_gather_single(out, local, group=object())
    with pytest.raises(UnplannedUseError, match="only a blocking gather"):
        group.all_gather_single(out, local, group=group, async_op=True)
    now[0] = 4
    with pytest.raises(UnplannedUseError, match="iteration 4"):
        group.all_gather_single(out, local, group=group)


def test_a_second_gather_in_one_iteration_is_unplanned():
    group = _group({}, [1])
    group.gathered[1] = IDLE  # the first gather of iteration 1 happened
    local, out = torch.zeros(11, dtype=torch.int64), torch.zeros(22, dtype=torch.int64)
    with pytest.raises(UnplannedUseError, match="one per iteration"):
        group.all_gather_single(out, local, group=group)


def test_every_other_collective_raises_inside_the_block():
    with attributes_set(dp_attention._collective_bindings()):
        with pytest.raises(UnplannedUseError, match=r"torch\.distributed\.all_reduce"):
            dist.all_reduce(torch.zeros(2))
        with pytest.raises(UnplannedUseError, match=r"torch\.distributed\.broadcast"):
            dist.broadcast(torch.zeros(2), src=0)
    assert dist.all_reduce.__name__ == "all_reduce"  # restored after the block


def test_peer_steps_are_checked():
    with pytest.raises(ValueError, match="idle, decode or extend"):
        PeerStep("verify", 2)
    with pytest.raises(ValueError, match="decode with 0 tokens"):
        PeerStep("decode")
    with pytest.raises(ValueError, match="idle with 3 tokens"):
        PeerStep("idle", 3)
