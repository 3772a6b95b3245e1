"""The prefill read-done fastpath in SGLang's own loop (variant prefill_pre_replay): every
forward through SGLang's ``EagerRunner``, whose extend asks the attention backend where the
prefill's shared reads end; the stand-in backend answers ``PRE_REPLAY`` (as TRT-LLM MHA does
for EXTEND), so SGLang's ``maybe_publish_prefill_shared_read_done`` records the read-done
event after ``init_forward_metadata`` and the scheduler's WAR barrier waits on it instead of
on the whole forward stream.

One child process imports SGLang once and runs the variant as released (the fixed twin of
every edit) and with one statement of SGLang's own code removed (recompiled from its file, so
the races name SGLang's lines): the barrier's wait on the event, or the event's record. Every
verdict is the detector's. The race either edit opens: the next chunk's
``cache_unfinished_req`` rewrites the chunked request's ``req_to_token`` row on the schedule
stream while the previous chunk's metadata prep may still read it on the forward stream. A
tree copy (slow) moves the backend's metadata init after the publish in a copy of SGLang's
eager runner and runs the command on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.engines.sglang_trees import edited_tree, run_child, run_sglang, unchanged

VARIANT = "prefill_pre_replay"
SCHEDULER = "sglang.srt.managers.scheduler"
READ_EVENT = "sglang.srt.model_executor.runner_utils.shared_read_event"
PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
PUBLISH_RECORD = "read_done.record()"

#: name -> (module, owner or "", function, needle)
REMOVALS = {
    "barrier_wait": (SCHEDULER, "Scheduler", "_apply_war_barrier",
                     "self.schedule_stream.wait_event(ev)"),
    "publish_record": (READ_EVENT, "", "maybe_publish_prefill_shared_read_done",
                       PUBLISH_RECORD),
}
#: the prefill result's host wait: the sampled tokens the eager path leaves on the device
#: are read by the host only behind it (the same removal as in the other variants)
HOST_WAIT = {"prefill_host_wait": (PROCESSOR, "SchedulerBatchResultProcessor",
                                   "process_batch_result_prefill",
                                   "result.copy_done.synchronize()")}

CHILD = """
import importlib, json
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
variant, removals = json.loads(sys.argv[1]), json.loads(sys.argv[2])
run = run_variant(VARIANTS[variant])
timeline = run.watch.recording.timeline
out = {"races": [race_record(r, variant) for r in run.races], "unknown": run.unknown_ops,
       "extends": run.worker.eager_forwards.extends,
       "decodes": run.worker.eager_forwards.decodes,
       "published": [(r.agent, r.iteration) for r in timeline if r.kind == "record"
                     and "shared_read_event.py" in str(r.source)],
       "preps": [(r.agent, r.iteration) for r in timeline
                 if r.name == "attn_metadata_prep (eager)"],
       "barrier_waits": [r.name for r in timeline if r.agent == "self.schedule_stream"
                         and r.kind == "wait" and "scheduler.py" in str(r.source)],
       "removed": {}}
for key, (module_name, owner, function, needle) in removals.items():
    module = importlib.import_module(module_name)
    holder = getattr(module, owner) if owner else module
    old = getattr(holder, function)
    target = site(holder, function, needle)
    with removed(target) as new:
        # from-imports of a module-level function name the old one: bind them too
        copies = [(m, k, new) for m in list(sys.modules.values())
                  for k, v in list(getattr(m, "__dict__", {}).items())
                  if v is old and m is not holder]
        with attributes_set(copies):
            mutated = run_variant(VARIANTS[variant])
    out["removed"][key] = {"races": [race_record(r, variant) for r in mutated.races],
                           "line": target.line, "code": target.code}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, VARIANT, {**REMOVALS, **HOST_WAIT})


@pytest.mark.engine_run
def test_the_fastpath_is_race_free_as_released(runs):
    assert runs["races"] == [] and runs["unknown"] == []


@pytest.mark.engine_run
def test_each_prefill_chunk_publishes_its_read_done_event_after_its_metadata_reads(runs):
    """The event is recorded by SGLang's shared_read_event.py on the forward stream, once per
    extend forward (none for decodes), after that forward's metadata prep; the barrier then
    waits on it (an event wait) rather than on the forward stream."""
    published = runs["published"]
    assert len(published) == runs["extends"] > 0 and runs["decodes"] > 0
    assert {agent for agent, _ in published} == {"self.forward_stream"}
    prep_iterations = [iteration for _, iteration in runs["preps"]]
    assert all(iteration in prep_iterations for _, iteration in published)
    assert runs["barrier_waits"].count("wait read_done") == len(published)


@pytest.mark.parametrize("key", sorted(REMOVALS))
@pytest.mark.engine_run
def test_without_the_event_the_chunk_prep_races_the_radix_rewrite(runs, key):
    """WAR on ``req_to_token``: the extend's metadata prep (forward stream, declared in the
    stand-in backend's ``init_forward_metadata``) reads the chunked row that the radix
    cache's rewrite (memory_pool.py, schedule stream) then overwrites, unordered once the
    event is never recorded or never waited on."""
    removal = runs["removed"][key]
    assert removal["code"] == REMOVALS[key][3]
    war = [r for r in removal["races"] if r["kind"] == "WAR"
           and r["tensor"].startswith("self.req_to_token@")]
    assert war, removal["races"]
    first, second = war[0]["first"], war[0]["second"]
    assert first["op"] == "attn_metadata_prep (eager)"
    assert first["file"].endswith("model_executor/runner/eager_runner.py")  # SGLang's call
    assert first["stream"] == "self.forward_stream"
    assert second["file"].endswith("mem_cache/memory_pool.py")
    assert second["stream"] == "self.schedule_stream"


def _metadata_init_after_publish(text: str) -> str:
    """``EagerRunner._execute_extend`` with the backend's ``init_forward_metadata`` statement
    moved after the ``maybe_publish_prefill_shared_read_done`` call (found by the file's
    syntax tree, never by a line number; fails when either is missing)."""
    runner = next(node for node in ast.walk(ast.parse(text))
                  if isinstance(node, ast.FunctionDef) and node.name == "_execute_extend")

    def statement(needle: str) -> ast.stmt:
        found = [node for node in ast.walk(runner) if isinstance(node, ast.Expr)
                 and needle in ast.unparse(node)]
        assert len(found) == 1, (needle, len(found))
        return found[0]
    init = statement("attn_backend.init_forward_metadata(")
    publish = statement("maybe_publish_prefill_shared_read_done(")
    assert init.lineno < publish.lineno
    lines = text.splitlines(keepends=True)
    moved = lines[init.lineno - 1:init.end_lineno]
    return "".join(lines[:init.lineno - 1] + lines[init.end_lineno:publish.end_lineno]
                   + moved + lines[publish.end_lineno:])


@pytest.mark.engine_run
def test_the_prefill_tokens_are_read_by_the_host_only_behind_the_result_copy(runs):
    """The eager path's sampled tokens are device memory copied to the host on the copy
    stream: without the prefill result's host wait, the host reads them before the copy."""
    races = runs["removed"]["prefill_host_wait"]["races"]
    assert races and {r["kind"] for r in races} == {"host-D2H"}, races


def _tree_command(tmp_path: Path, moved: bool) -> tuple[int, str, dict]:
    """The command on a tree whose eager extend calls the backend's metadata init after the
    publish of the read-done event (``moved``), or as released."""
    edit = _metadata_init_after_publish if moved else unchanged
    tree = edited_tree(tmp_path, "srt/model_executor/runner/eager_runner.py",
                       edit)
    return run_sglang("--sglang-src", str(tree), "--variant", VARIANT,
                      json_path=tmp_path / "races.json", timeout=600)


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_with_the_metadata_read_after_the_event_races_in_its_own_file(tmp_path):
    status, output, document = _tree_command(tmp_path, moved=True)
    assert status == 1, output
    war = [r for r in document["races"] if r["kind"] == "WAR"
           and r["first"]["op"] == "attn_metadata_prep (eager)"]
    assert war and war[0]["first"]["file"].startswith("sglang/srt/"), output  # the tree's


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_as_released_is_race_free(tmp_path):
    status, output, document = _tree_command(tmp_path, moved=False)
    assert status == 0, output
    assert document["races"] == []
