"""The variants that reach SGLang 0.5.23's sites under their own configurations: grammar
(grammar_eagle_topk1), an embedding model (embedding), delayed sampling (delay_sample), the
spec-v2 resolves on HIP (eagle_d2h_stream_hip, eagle_mixed_hip).

One child process imports SGLang once, runs each variant as released (the fixed twin) and
with one sync statement of SGLang's own function removed (recompiled from its file, so the
races name SGLang's lines); every verdict is the detector's. The removed statement is found
by its function and code (and, where the function holds the same code twice, the first one
after an anchor line), never by a line number. A tree copy (slow) removes the grammar
barrier's host wait from a copy of SGLang's file and runs the command on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.sglang_trees import (
    GRAMMAR_SPY,
    edited_tree,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)

MANAGERS = "sglang.srt.managers"

#: name -> (variant, module, owner, function, needle, anchor or "", SGLang files a race names)
REMOVALS = {
    # the grammar barrier reads the previous batch's tokens on the host after this wait
    "grammar_host_wait": ("grammar_eagle_topk1",
                          f"{MANAGERS}.scheduler_components.batch_result_processor",
                          "SchedulerBatchResultProcessor", "advance_grammar_fsm",
                          "result.copy_done.synchronize()", "", ("common.py",)),
    # the verify tree's host copy is read after this wait
    "grammar_tree_wait": ("grammar_eagle_topk1", "sglang.srt.speculative.spec_utils",
                          "GrammarTree", "resolve", "self._done.synchronize()", "",
                          ("common.py", "spec_utils.py")),
    # an embedding model's forward enters the forward stream behind the schedule stream
    "embedding_forward_entry": ("embedding", f"{MANAGERS}.scheduler", "Scheduler", "run_batch",
                                "self.forward_stream.wait_stream(self.schedule_stream)",
                                "else:  # embedding or reward model",
                                ("scheduler.py", "allocation.py")),
    # the embedding result processor's host wait for the pooled vectors' copy
    "embedding_host_wait": ("embedding",
                            f"{MANAGERS}.scheduler_components.batch_result_processor",
                            "SchedulerBatchResultProcessor", "process_batch_result_prefill",
                            "result.copy_done.synchronize()",
                            "else:  # embedding or reward model", ("common.py",)),
    # the event that wait returns on, never recorded
    "embedding_copy_done": ("embedding", f"{MANAGERS}.utils", "EmbeddingBatchResult",
                            "copy_to_cpu", "self.copy_done.record()", "", ("common.py",)),
}
FIXED_TWINS = ("grammar_eagle_topk1", "embedding", "delay_sample", "eagle_d2h_stream_hip",
               "eagle_mixed_hip")

CHILD = GRAMMAR_SPY + """
import importlib, inspect, json
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
removals, twins = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"twins": {}, "removed": {}}
for name in twins:
    run = run_variant(VARIANTS[name])
    out["twins"][name] = {"races": [race_record(r, name) for r in run.races],
                          "forwards": run.forwards, "unknown": run.unknown_ops,
                          "delayed": getattr(run.worker, "delayed_samples", 0)}
out["accepted"] = [len(g.accepted_tokens) for g in grammars]
for key, (variant, module, owner, function, needle, anchor, _files) in removals.items():
    target_owner = getattr(importlib.import_module(module), owner)
    lines = inspect.getsourcelines(getattr(target_owner, function))[0]
    start = next((i for i, t in enumerate(lines) if anchor and anchor in t), 0)
    occurrence = sum(needle in t for t in lines[:start]) + 1
    target = site(target_owner, function, needle, occurrence)
    with removed(target):
        run = run_variant(VARIANTS[variant])
    out["removed"][key] = {"races": [race_record(r, variant) for r in run.races],
                           "line": target.line, "code": target.code}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, REMOVALS, FIXED_TWINS)


@pytest.mark.parametrize("variant", FIXED_TWINS)
@pytest.mark.engine_run
def test_variant_is_race_free_as_released(runs, variant):
    twin = runs["twins"][variant]
    assert twin["races"] == []
    assert twin["unknown"] == []  # every kernel on the path is declared
    assert twin["forwards"] >= 4


@pytest.mark.engine_run
def test_the_grammar_objects_advanced_on_sglangs_path(runs):
    """SGLang's prefill and barrier advances fed every constrained request's grammar."""
    assert runs["accepted"] and all(n >= 2 for n in runs["accepted"]), runs["accepted"]


@pytest.mark.engine_run
def test_the_delayed_sampler_ran(runs):
    assert runs["twins"]["delay_sample"]["delayed"] >= 3


@pytest.mark.parametrize("key", sorted(REMOVALS))
@pytest.mark.engine_run
def test_removing_the_sync_races_at_sglang_lines(runs, key):
    removal = runs["removed"][key]
    assert REMOVALS[key][4] in removal["code"]
    races = removal["races"]
    assert races, f"{key}: no race without line {removal['line']}"
    named = {Path(side["file"]).name for race in races for side in (race["first"],
                                                                     race["second"])}
    assert named & set(REMOVALS[key][6]), named


def _tree_command(tmp_path: Path, remove: bool) -> tuple[int, str, dict]:
    """The command on a tree whose result processor lacks the grammar barrier's host wait
    (``remove``), or is as released."""
    edit = (statement_passed("advance_grammar_fsm", "copy_done.synchronize()") if remove
            else unchanged)
    tree = edited_tree(tmp_path, "srt/managers/scheduler_components/batch_result_processor.py",
                       edit)
    return run_sglang("--sglang-src", str(tree), "--variant", "grammar_eagle_topk1",
                      json_path=tmp_path / "races.json", timeout=600)


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_without_the_grammar_host_wait_races_in_its_own_file(tmp_path):
    status, output, document = _tree_command(tmp_path, remove=True)
    assert status == 1, output
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    assert any(s["file"] == "sglang/srt/managers/scheduler_components/"
                            "batch_result_processor.py" for s in sides), output  # the tree's
    assert {r["kind"] for r in document["races"]} >= {"host-D2H"}


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_with_the_grammar_host_wait_is_race_free(tmp_path):
    status, output, document = _tree_command(tmp_path, remove=False)
    assert status == 0, output
    assert document["races"] == []
