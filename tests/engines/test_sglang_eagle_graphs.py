"""EAGLE's target verify and draft extend under SGLang's CUDA-graph runners
(eagle_topk1_graph, eagle_topk4_graph, each also with the plan stream on: ``_plan``) and
grammar-constrained requests without speculation (grammar).

One child process imports SGLang once, runs each variant as released (the fixed twin) and
with one sync statement of SGLang's own function removed (recompiled from its file, so the
races name SGLang's lines, and bound wherever the module's name was imported); every verdict
is the detector's. The statement is found by its function and code, never by a line number.

The verify's plan-stream joins (``run_eagle_verify``: the plan stream waits on the forward
stream; the forward stream waits on the plan stream) are necessary once the verify graph's
``load_batch`` stages the draft output on the plan stream, and not in the eager chain verify:
the same removals race in the graph variants and not in eagle_topk1. A tree copy (slow)
removes the first join from a copy of SGLang's file and runs the command on it.
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

COMMON = "sglang.srt.speculative.eagle_worker_common"
PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
PLAN_WAITS_FORWARD = "plan_stream.wait_stream(fwd_stream)"
FORWARD_WAITS_PLAN = ".current_stream().wait_stream(plan_stream)"

#: name -> (variant, module, owner or "", function, needle)
RACING = {
    "graph_plan_waits_forward": ("eagle_topk1_graph_plan", COMMON, "", "run_eagle_verify",
                                 PLAN_WAITS_FORWARD),
    "graph_forward_waits_plan": ("eagle_topk1_graph_plan", COMMON, "", "run_eagle_verify",
                                 FORWARD_WAITS_PLAN),
    "tree_graph_plan_waits_forward": ("eagle_topk4_graph_plan", COMMON, "", "run_eagle_verify",
                                      PLAN_WAITS_FORWARD),
    "tree_graph_forward_waits_plan": ("eagle_topk4_graph_plan", COMMON, "", "run_eagle_verify",
                                      FORWARD_WAITS_PLAN),
    # the grammar path's host wait before each result's tokens advance the grammars
    "grammar_decode_host_wait": ("grammar", PROCESSOR, "SchedulerBatchResultProcessor",
                                 "process_batch_result_decode",
                                 "result.copy_done.synchronize()"),
    "grammar_prefill_host_wait": ("grammar", PROCESSOR, "SchedulerBatchResultProcessor",
                                  "process_batch_result_prefill",
                                  "result.copy_done.synchronize()"),
}
#: the same joins removed where the verify is eager (topk 1): nothing on the plan stream
#: reads the draft output, so they order nothing a kernel needs
EAGER = {
    "eager_plan_waits_forward": ("eagle_topk1", COMMON, "", "run_eagle_verify",
                                 PLAN_WAITS_FORWARD),
    "eager_forward_waits_plan": ("eagle_topk1", COMMON, "", "run_eagle_verify",
                                 FORWARD_WAITS_PLAN),
}
FIXED_TWINS = ("eagle_topk1_graph", "eagle_topk1_graph_plan", "eagle_topk4_graph",
               "eagle_topk4_graph_plan", "grammar")

CHILD = GRAMMAR_SPY + """
import importlib, json
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
removals, twins = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"twins": {}, "removed": {}}
for name in twins:
    run = run_variant(VARIANTS[name])
    graphs = getattr(run.worker, "verify_graphs", None)
    ops = [r.name for r in run.watch.recording.timeline]
    out["twins"][name] = {"races": [race_record(r, name) for r in run.races],
                          "forwards": run.forwards, "unknown": run.unknown_ops,
                          "replays": graphs.replays if graphs else 0,
                          "delayed": getattr(run.worker, "delayed_samples", 0),
                          "masked": ops.count("apply_token_bitmask_inplace"),
                          "extend_replays": sum(r.name.startswith(
                              "graph.replay: draft_extend_forward_in_graph")
                              for r in run.watch.recording.timeline),
                          "plan_ops": sum(r.agent == "plan_stream" and "small_copy" in r.name
                                          for r in run.watch.recording.timeline)}
out["accepted"] = [len(g.accepted_tokens) for g in grammars]
for key, (variant, module_name, owner, function, needle) in removals.items():
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
            run = run_variant(VARIANTS[variant])
    out["removed"][key] = {"races": [race_record(r, variant) for r in run.races],
                           "line": target.line, "code": target.code}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, {**RACING, **EAGER}, FIXED_TWINS)


@pytest.mark.parametrize("variant", FIXED_TWINS)
@pytest.mark.engine_run
def test_variant_is_race_free_as_released(runs, variant):
    twin = runs["twins"][variant]
    assert twin["races"] == []
    assert twin["unknown"] == []  # every kernel on the path is declared
    assert twin["forwards"] >= 4


@pytest.mark.parametrize("variant", ("eagle_topk1_graph", "eagle_topk1_graph_plan",
                                     "eagle_topk4_graph", "eagle_topk4_graph_plan"))
@pytest.mark.engine_run
def test_every_decode_verify_and_draft_extend_replays_its_graph(runs, variant):
    """The 2 prefills (and their draft extends) run eager; each decode iteration's verify
    and draft extend are replays of SGLang's runners."""
    twin = runs["twins"][variant]
    assert twin["replays"] == twin["forwards"] - 2
    assert twin["extend_replays"] == twin["forwards"] - 2


@pytest.mark.parametrize("topk", (1, 4))
@pytest.mark.engine_run
def test_only_the_plan_variant_stages_the_verify_on_the_plan_stream(runs, topk):
    assert runs["twins"][f"eagle_topk{topk}_graph_plan"]["plan_ops"] > 0
    assert runs["twins"][f"eagle_topk{topk}_graph"]["plan_ops"] == 0


@pytest.mark.engine_run
def test_the_grammar_variant_samples_behind_sglangs_mask(runs):
    """Every forward deferred its sampling; each sample applied the grammars' bitmask; the
    result processors advanced every request's grammar."""
    twin = runs["twins"]["grammar"]
    assert twin["delayed"] == twin["forwards"]
    assert twin["masked"] == twin["forwards"]
    assert runs["accepted"] and all(n >= 3 for n in runs["accepted"]), runs["accepted"]


@pytest.mark.parametrize("key", sorted(RACING))
@pytest.mark.engine_run
def test_removing_the_sync_races_at_sglang_lines(runs, key):
    removal = runs["removed"][key]
    assert RACING[key][4] in removal["code"]
    assert removal["races"], f"{key}: no race without line {removal['line']}"


@pytest.mark.parametrize("key", sorted(EAGER))
@pytest.mark.engine_run
def test_the_same_joins_order_nothing_in_the_eager_chain_verify(runs, key):
    removal = runs["removed"][key]
    assert EAGER[key][4] in removal["code"]
    assert removal["races"] == []


@pytest.mark.engine_run
def test_the_graph_plan_race_names_the_plan_stream_load(runs):
    """Without the plan stream's wait the graph's static-input copy (load_batch, on the plan
    stream) reads the draft output before the forward stream wrote it."""
    races = runs["removed"]["graph_plan_waits_forward"]["races"]
    assert any(side["stream"] == "plan_stream" and "cuda_graph_buffer_registry" in side["file"]
               for race in races for side in (race["first"], race["second"])), races[:2]


@pytest.mark.parametrize("variant, expected, absent", [
    ("eagle_topk1_graph_plan", {"VERIFY_GRAPH_LOAD", "DRAFT_EXTEND_GRAPHS", "DECODE_GRAPHS",
                                "EAGLE_V2"}, {"DELAYED_SAMPLE"}),
    ("eagle_topk4_graph", {"VERIFY_GRAPH_LOAD", "DRAFT_EXTEND_GRAPHS"}, set()),
    ("eagle_topk4_graph_plan", {"VERIFY_GRAPH_LOAD", "DRAFT_EXTEND_GRAPHS"}, set()),
    ("eagle_topk1", {"EAGLE_V2"}, {"VERIFY_GRAPH_LOAD", "DRAFT_EXTEND_GRAPHS"}),
    ("grammar", {"DELAYED_SAMPLE"}, {"EAGLE_V2", "VERIFY_GRAPH_LOAD"}),
])
def test_the_new_variants_need_their_features(variant, expected, absent):
    """A release is checked for the features the variant's configuration drives (no SGLang
    needed: the features are read from the variant)."""
    from overlap_harness.engines.sglang import release_features
    from overlap_harness.engines.sglang.variants import VARIANTS

    needed = {name for name in dir(release_features)
              if isinstance(getattr(release_features, name), release_features.Feature)
              and getattr(release_features, name)
              in release_features.required_features(VARIANTS[variant])}
    assert expected <= needed and not absent & needed, needed


def _tree_command(tmp_path: Path, remove: bool) -> tuple[int, str, dict]:
    """The command on a tree whose verify lacks its plan stream's wait for the forward stream
    (``remove``), or is as released."""
    edit = statement_passed("run_eagle_verify", PLAN_WAITS_FORWARD) if remove else unchanged
    tree = edited_tree(tmp_path, "srt/speculative/eagle_worker_common.py", edit)
    return run_sglang("--sglang-src", str(tree), "--variant", "eagle_topk1_graph_plan",
                      json_path=tmp_path / "races.json", timeout=600)


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_without_the_verify_plan_wait_races_in_its_own_file(tmp_path):
    status, output, document = _tree_command(tmp_path, remove=True)
    assert status == 1, output
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    assert any(s["file"].startswith("sglang/srt/") for s in sides), output  # the tree's


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_with_the_verify_plan_wait_is_race_free(tmp_path):
    status, output, document = _tree_command(tmp_path, remove=False)
    assert status == 0, output
    assert document["races"] == []
