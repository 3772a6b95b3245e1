"""SGLang's unified memory pool under the overlap loop (variant unified_memory).

With ``--enable-unified-memory`` ``Scheduler.run_batch`` records a ``forward_done`` event on
the forward stream after each forward and hands it to the pool's allocator
(``set_latest_forward_done_event``, ``set_inflight_forward``); lazy compaction's urgent
``_flush`` waits on it (``_settle_inflight_forward``) before it moves pages and hands the
moved-from pages out again. The variant prefills a 40-token prompt in chunks while SGLang's
sliding-window eviction leaves holes in the SWA sub-pool, so a chunk's allocation compacts
them while the previous chunk's forward is in flight; its backend publishes the prefill's
read-done event early (PRE_REPLAY), so the WAR barrier does not wait for that forward's KV
reads and writes.

One child imports SGLang once and runs the variant as released (the fixed twin of every
edit), with the record removed, and with the allocator's wait removed (each statement of
SGLang's own code, recompiled from its file, so the races name SGLang's lines). It also runs
the same requests with a backend whose reads end after the forward (the barrier then waits
on the whole forward stream): there the record's removal is race-free (redundant), because
the barrier already orders the next iteration's compaction after the whole forward. Every
verdict is the detector's. A tree copy (slow) removes the record in a copy of SGLang's
scheduler.py and runs the command on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.sglang_trees import (
    edited_tree,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)

VARIANT = "unified_memory"
SCHEDULER = "sglang.srt.managers.scheduler"
SUB_POOL = "sglang.srt.mem_cache.allocator.unified_sub_pool"
RECORD = "forward_done.record(stream=self.forward_stream)"

#: name -> (module, owner, function, needle)
REMOVALS = {
    "forward_done_record": (SCHEDULER, "Scheduler", "run_batch", RECORD),
    "flush_waits_forward_done": (SUB_POOL, "MultiEndedAllocator", "_settle_inflight_forward",
                                 "torch.cuda.current_stream().wait_event(ev)"),
}

CHILD = """
import dataclasses, importlib, json
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
variant, removals = json.loads(sys.argv[1]), json.loads(sys.argv[2])
early = VARIANTS[variant]
# the same requests with a backend whose reads end after the forward (coarse WAR barrier)
coarse = dataclasses.replace(early, unified_memory=dataclasses.replace(
    early.unified_memory, prefill_reads_end_pre_replay=False))

def moves(run):
    allocator = run.scheduler.token_to_kv_pool_allocator
    return {sub.sub_pool_name: sub._stats_n_flush_moves
            for sub in (allocator.full_attn_allocator, allocator.swa_attn_allocator)}

def outcome(run):
    timeline = run.watch.recording.timeline
    return {"races": [race_record(r, variant) for r in run.races],
            "unknown": [f"{u.name} at {u.site}" for u in run.watch.unknown_ops],
            "moves": moves(run), "forwards": run.forwards,
            "forward_done": [(r.agent, r.iteration) for r in timeline if r.kind == "record"
                             and r.name == "forward_done.record"]}

def without(key, configuration):
    module_name, owner, function, needle = removals[key]
    holder = getattr(importlib.import_module(module_name), owner)
    target = site(holder, function, needle)
    with removed(target):
        run = run_variant(configuration)
    return {**outcome(run), "line": target.line, "code": target.code}

out = {"intact": outcome(run_variant(early)), "coarse": outcome(run_variant(coarse)),
       "removed": {key: without(key, early) for key in removals},
       "coarse_removed": without("forward_done_record", coarse)}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, VARIANT, REMOVALS)


def _only_the_pools_pointer_table(unknown: list[str]) -> bool:
    """The one op of unknown access: the unified MHA pool's constructor reading its
    buffers' ``data_ptr()`` into a table (``_init_data_ptrs_and_strides``) for kernels the
    variant never launches."""
    return all(entry.startswith("data_ptr at ") and "mem_cache/memory_pool.py" in entry
               for entry in unknown)


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_unified_pool_is_race_free_as_released_and_compacts_in_flight(runs):
    """Race-free, every forward recording forward_done on the forward stream, and the SWA
    sub-pool's urgent flush moving pages (the compaction the event guards)."""
    intact = runs["intact"]
    assert intact["races"] == [] and _only_the_pools_pointer_table(intact["unknown"])
    assert len(intact["forward_done"]) == intact["forwards"] > 0
    assert {agent for agent, _ in intact["forward_done"]} == {"self.forward_stream"}
    assert intact["moves"]["swa"] > 0, intact["moves"]


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(REMOVALS))
@pytest.mark.engine_run
def test_without_the_event_compaction_races_the_forward_in_flight(runs, key):
    """The compaction's page copy (``copy_pages``) reads, and the hand-out's ``zero_pages``
    writes, on the schedule stream a page the chunk in flight writes and reads on the
    forward stream: ordered only by the allocator's wait on forward_done."""
    removal = runs["removed"][key]
    assert removal["code"] == REMOVALS[key][3]
    races = removal["races"]
    assert races, removal
    assert {r["tensor"].split("@")[0] for r in races} == {"self._raw"}
    assert {r["first"]["op"] for r in races} == {"model_forward"}
    assert {r["first"]["stream"] for r in races} == {"self.forward_stream"}
    assert {r["second"]["op"] for r in races} >= {"copy_pages", "zero_pages"}
    assert {r["second"]["stream"] for r in races} == {"self.schedule_stream"}


@pytest.mark.slow
@pytest.mark.engine_run
def test_under_the_whole_forward_barrier_the_record_is_redundant(runs):
    """With a backend whose reads end after the forward, the WAR barrier after run_batch
    waits on the whole forward stream, so the next iteration's compaction is ordered after
    the forward without forward_done: its removal is race-free (the site redundant), the
    same compaction moving pages."""
    assert runs["coarse"]["races"] == [] and runs["coarse"]["moves"]["swa"] > 0
    removal = runs["coarse_removed"]
    assert removal["races"] == [] and removal["moves"]["swa"] > 0


def _tree_command(tmp_path: Path, without_record: bool) -> tuple[int, str, dict]:
    edit = statement_passed("run_batch", "forward_done.record") if without_record else (
        unchanged)
    tree = edited_tree(tmp_path, "srt/managers/scheduler.py", edit)
    return run_sglang("--sglang-src", str(tree), "--variant", VARIANT,
                      json_path=tmp_path / "races.json", timeout=600)


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_without_the_record_races_at_its_own_lines(tmp_path):
    status, output, document = _tree_command(tmp_path, without_record=True)
    assert status == 1, output
    tree = str(tmp_path / "tree/sglang/srt")
    copies = [r for r in document["races"] if r["second"]["op"] == "copy_pages"]
    assert copies, output
    # the forward at the copy's run_batch (scheduler.py, edited), the page copy at SGLang's
    # launch of the kernel in the copy (linked files keep the copy's path)
    assert {r["first"]["file"] for r in copies} == {f"{tree}/managers/scheduler.py"}, copies
    package = str(tmp_path / "tree/sglang")
    assert {r["second"]["file"] for r in copies} == {
        f"{package}/kernels/ops/kvcache/copy_pages.py"}, copies


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_as_released_is_race_free(tmp_path):
    status, output, document = _tree_command(tmp_path, without_record=False)
    assert status == 0, output
    assert document["races"] == []
