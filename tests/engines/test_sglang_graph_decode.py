"""Decode under CUDA graphs in SGLang's own loop: its ``DecodeCudaGraphRunner`` captures at
startup and replays each decode batch, the read-done event recorded inside the graph.

One child process runs ``overlap-harness sglang --necessity`` on the three graph variants, as
a user runs it. The intact loop is the fixed twin of every mutation: race-free. The verdicts
are the detector's: removing the event's record inside the graph (decode_cuda_graph_runner.py
``event.record()``), the runner's post-replay ``read_done.record()``, or the scheduler's WAR
barrier wait leaves the graph's attention prep reading ``req_to_token`` while the radix cache
rewrites it on the schedule stream. Skipped, with the import's own error, without SGLang.
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
GRAPH_VARIANTS = ("graph_decode", "graph_decode_radix", "graph_decode_post_replay",
                  "graph_decode_radix_pre_replay")
RUNNER = "model_executor/runner/decode_cuda_graph_runner.py"
IN_GRAPH_RECORD = "event.record()"  # _record_in_graph_metadata_prep_done, during capture
POST_REPLAY_RECORD = "read_done.record()"  # _publish_read_done(in_graph=False)
BARRIER_WAIT = "self.schedule_stream.wait_event(ev)"  # _apply_war_barrier


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[int, str, dict]:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    json_path = tmp_path_factory.mktemp("graphs") / "table.json"
    variants = [arg for name in GRAPH_VARIANTS for arg in ("--variant", name)]
    done = subprocess.run(
        [sys.executable, "-m", "overlap_harness", "sglang", "--necessity", *variants, "-j", "2",
         "--json", str(json_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600, check=False)
    output = done.stdout + done.stderr
    if done.returncode == 2 and "overlap-harness sglang: import " in output:
        pytest.skip(output.strip().splitlines()[-1])
    return done.returncode, output, json.loads(json_path.read_text())


def _row(document: dict, variant: str, file_tail: str, code: str) -> dict:
    rows = [r for r in document["necessity"] if r["variant"] == variant
            and r["site"].rsplit(":", 1)[0].endswith(file_tail) and r["code"] == code]
    assert len(rows) == 1, (variant, file_tail, code, rows)
    return rows[0]


@pytest.mark.parametrize("variant", GRAPH_VARIANTS)
@pytest.mark.engine_run
def test_the_loop_with_decode_graphs_is_race_free_as_released(table, variant):
    status, output, document = table
    assert status == 0, output
    assert [r for r in document["races"] if r["variant"] == variant] == []
    assert f"  {variant}: race-free" in output


@pytest.mark.parametrize(("variant", "code"), [
    ("graph_decode_radix", IN_GRAPH_RECORD),
    ("graph_decode_post_replay", POST_REPLAY_RECORD),
    ("graph_decode_radix", BARRIER_WAIT),
])
@pytest.mark.engine_run
def test_without_the_read_done_event_the_graph_prep_races_the_radix_rewrite(table, variant,
                                                                             code):
    """WAR on ``req_to_token``: the replayed in-graph attention prep (issued at SGLang's
    ``FullCudaGraphBackend.replay``) reads a row the radix cache then rewrites on the schedule
    stream (memory_pool.py), unordered once the event is never recorded or never waited on."""
    file_tail = "managers/scheduler.py" if code == BARRIER_WAIT else RUNNER
    row = _row(table[2], variant, file_tail, code)
    assert row["verdict"] == "necessary" and row["reached"] > 0, row
    war = [r for r in row["races"] if r["kind"] == "WAR"
           and r["tensor"].startswith("self.req_to_token@")]
    assert war, row["races"]
    first, second = war[0]["first"], war[0]["second"]
    assert first["file"].endswith("runner_backend/full_cuda_graph_backend.py")
    assert first["op"].startswith("graph.replay: attn_metadata_prep_in_graph")
    assert first["stream"] == "self.forward_stream"
    assert second["file"].endswith("mem_cache/memory_pool.py")
    assert second["stream"] == "self.schedule_stream"


@pytest.mark.engine_run
def test_a_backend_preparing_before_the_replay_races_without_the_barrier_wait(table):
    """PRE_REPLAY (decode metadata prepared out of the graph, before the replay): the
    scheduler's WAR barrier removed, the out-of-graph prep on the forward stream reads the row
    the radix cache rewrites on the schedule stream; the in-graph record is not what orders
    it (the backend captures no prep)."""
    row = _row(table[2], "graph_decode_radix_pre_replay", "managers/scheduler.py", BARRIER_WAIT)
    assert row["verdict"] == "necessary" and row["reached"] > 0, row
    war = [r for r in row["races"] if r["kind"] == "WAR"
           and r["tensor"].startswith("self.req_to_token@")]
    assert war, row["races"]
    assert war[0]["first"]["op"] == "attn_metadata_prep_out_graph", war[0]["first"]
    assert war[0]["first"]["stream"] == "self.forward_stream"
    assert war[0]["second"]["stream"] == "self.schedule_stream"


@pytest.mark.engine_run
def test_each_read_done_site_is_reached_where_its_backend_declares_it(table):
    """IN_REPLAY (SGLang's default for decode): the event recorded inside the graph at each
    capture is the one waited on; POST_REPLAY: a fresh event after each replay, the in-graph
    one recorded but unused (redundant there), and the in-graph one's site never publishes."""
    document = table[2]
    for variant in ("graph_decode", "graph_decode_radix"):
        assert _row(document, variant, RUNNER, IN_GRAPH_RECORD)["reached"] > 0
        assert _row(document, variant, RUNNER, POST_REPLAY_RECORD)["verdict"] == "not_reached"
    post = _row(document, "graph_decode_post_replay", RUNNER, IN_GRAPH_RECORD)
    assert post["verdict"] == "redundant" and post["reached"] > 0
    assert _row(document, "graph_decode_post_replay", RUNNER,
                POST_REPLAY_RECORD)["reached"] > 0


@pytest.mark.engine_run
def test_decode_graphs_keep_the_host_syncs_the_eager_loop_needs(table):
    """The result copies' host syncs (prefill and decode results) still order the host's read
    of the tokens: each one reached is necessary, with host-D2H races."""
    rows = [r for r in table[2]["necessity"] if r["variant"] == "graph_decode"
            and r["code"] == "result.copy_done.synchronize()" and r["reached"]]
    assert len(rows) == 2, rows
    for row in rows:
        assert row["verdict"] == "necessary"
        assert {r["kind"] for r in row["races"]} == {"host-D2H"}
