"""SGLang's FutureMap relay written by a replayed CUDA graph (DSpark's in-graph scatter).

DSpark's ``_scatter_future_relay`` is captured into a graph and replayed on the forward
stream; SGLang's real ``FutureMap`` adopts the relay it writes, its ``publish``/``stash`` skip
their scatter for the tensors the graph scattered, and the next batch's resolve reads the
relay through ``publish_ready`` and the private D2H stream. One child process runs it (SGLang
imported as the engines import it, whatever this process imported before). The intact run
is the fixed twin of each mutation; every verdict is the detector's. Skipped, with the
import's own error, without SGLang.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MUTATIONS = ("d2h_wait_event", "publish_ready_record")


@pytest.fixture(scope="module")
def relay() -> dict:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    done = subprocess.run(
        [sys.executable, "-m", "overlap_harness.engines.sglang.features.relay_in_graph"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600, check=False)
    if done.returncode == 2 and "relay_replay: " in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pairs(relay: dict, run: str) -> set[tuple[str, str]]:
    return {tuple(pair) for pair in relay["runs"][run]["race_pairs"]}


@pytest.mark.engine_run
def test_the_relay_path_is_race_free_as_released(relay):
    intact = relay["runs"]["intact"]
    assert intact["race_pairs"] == []
    assert intact["unknown_ops"] == []


@pytest.mark.engine_run
def test_the_future_map_reads_what_the_replayed_graph_scattered(relay):
    intact = relay["runs"]["intact"]
    # the FutureMap adopted the relay the graph writes, relays no hidden states (DSpark's
    # spec config), and each step's publish and stash found their tensor already scattered
    assert intact["adopted"]
    assert not intact["hidden_states_relayed"]
    assert intact["scatters_skipped"] == 2 * 3
    # lengths: prompt 3 + 1 after the prefill, then + the accept lens (2, 1), (3, 3)
    assert intact["seq_lens_seen"] == [[4, 4], [6, 5], [9, 8]]
    # the bonus gathered each step is the previous replay's (11, 12 from the prefill)
    assert intact["bonus_seen"][0] == [11, 12]
    assert intact["bonus_seen"][1] == [(11 * 7 + 2) % 1000, (12 * 7 + 1) % 1000]


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.engine_run
def test_a_removed_future_map_sync_races_at_sglangs_lines(relay, mutation):
    assert relay["runs"]["intact"]["race_pairs"] == []  # the fixed twin
    lines = relay["lines"]
    # the prefill's host scatter (FutureMap.publish) against the D2H stream's copy
    # (resolve_seq_lens_cpu), which no longer waits for the publish
    pairs = _pairs(relay, mutation)
    assert (lines["publish_scatter"], lines["d2h_copy"]) in pairs, pairs


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.engine_run
def test_a_removed_future_map_sync_races_with_the_replayed_graph_scatter(relay, mutation):
    lines = relay["lines"]
    assert (lines["graph_scatter"], lines["d2h_copy"]) in _pairs(relay, mutation)
