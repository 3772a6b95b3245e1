"""EAGLE's target verify and draft extend under SGLang's CUDA-graph runners
(eagle_topk1_graph, _graph_plan, eagle_topk4_graph) and grammar-constrained requests without
speculation (grammar).

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

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    "tree_graph_plan_waits_forward": ("eagle_topk4_graph", COMMON, "", "run_eagle_verify",
                                      PLAN_WAITS_FORWARD),
    "tree_graph_forward_waits_plan": ("eagle_topk4_graph", COMMON, "", "run_eagle_verify",
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
FIXED_TWINS = ("eagle_topk1_graph", "eagle_topk1_graph_plan", "eagle_topk4_graph", "grammar")

CHILD = """
import importlib, json, sys
from overlap_harness.engines.sglang import environment
try:
    environment.load()
except environment.SglangTreeError as exc:
    print("SKIP", exc); sys.exit(3)
from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang import grammar_build
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
grammars = []
constrain = grammar_build.constrain
def spy(req):
    constrain(req)
    grammars.append(req.grammar)
grammar_build.constrain = spy
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
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps({**RACING, **EAGER}),
                           json.dumps(FIXED_TWINS)], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    if done.returncode == 3:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


@pytest.mark.parametrize("variant", FIXED_TWINS)
def test_variant_is_race_free_as_released(runs, variant):
    twin = runs["twins"][variant]
    assert twin["races"] == []
    assert twin["unknown"] == []  # every kernel on the path is declared
    assert twin["forwards"] >= 4


@pytest.mark.parametrize("variant", ("eagle_topk1_graph", "eagle_topk1_graph_plan",
                                     "eagle_topk4_graph"))
def test_every_decode_verify_and_draft_extend_replays_its_graph(runs, variant):
    """The 2 prefills (and their draft extends) run eager; each decode iteration's verify
    and draft extend are replays of SGLang's runners."""
    twin = runs["twins"][variant]
    assert twin["replays"] == twin["forwards"] - 2
    assert twin["extend_replays"] == twin["forwards"] - 2


def test_only_the_plan_variant_stages_the_verify_on_the_plan_stream(runs):
    assert runs["twins"]["eagle_topk1_graph_plan"]["plan_ops"] > 0
    assert runs["twins"]["eagle_topk1_graph"]["plan_ops"] == 0


def test_the_grammar_variant_samples_behind_sglangs_mask(runs):
    """Every forward deferred its sampling; each sample applied the grammars' bitmask; the
    result processors advanced every request's grammar."""
    twin = runs["twins"]["grammar"]
    assert twin["delayed"] == twin["forwards"]
    assert twin["masked"] == twin["forwards"]
    assert runs["accepted"] and all(n >= 3 for n in runs["accepted"]), runs["accepted"]


@pytest.mark.parametrize("key", sorted(RACING))
def test_removing_the_sync_races_at_sglang_lines(runs, key):
    removal = runs["removed"][key]
    assert RACING[key][4] in removal["code"]
    assert removal["races"], f"{key}: no race without line {removal['line']}"


@pytest.mark.parametrize("key", sorted(EAGER))
def test_the_same_joins_order_nothing_in_the_eager_chain_verify(runs, key):
    removal = runs["removed"][key]
    assert EAGER[key][4] in removal["code"]
    assert removal["races"] == []


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


def _join_line(path: Path) -> int:
    """The line of ``run_eagle_verify``'s ``plan_stream.wait_stream(fwd_stream)`` in
    ``path``."""
    tree = ast.parse(path.read_text())
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                    and node.name == "run_eagle_verify")
    return next(node.lineno for node in ast.walk(function) if isinstance(node, ast.Expr)
                and PLAN_WAITS_FORWARD in ast.unparse(node))


def _mirror(source: Path, target: Path, edited: Path, remove: bool) -> None:
    """``target`` mirrors ``source`` with symlinks, except ``edited`` (relative): a real
    copy, with the verify's plan-stream wait made ``pass`` when ``remove``."""
    target.mkdir()
    head = edited.parts[0]
    for entry in source.iterdir():
        if entry.name == head and len(edited.parts) > 1:
            _mirror(entry, target / head, Path(*edited.parts[1:]), remove)
        elif entry.name == head:
            lines = entry.read_text().splitlines(keepends=True)
            if remove:
                index = _join_line(entry) - 1
                text = lines[index]
                lines[index] = text[: len(text) - len(text.lstrip())] + "pass\n"
            (target / head).write_text("".join(lines))
        elif entry.name != "__pycache__":
            (target / entry.name).symlink_to(entry)


def _tree_command(tmp_path: Path, remove: bool) -> tuple[int, str, dict]:
    installed = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    tree = tmp_path / "tree"
    tree.mkdir()
    _mirror(installed, tree / "sglang", Path("srt/speculative/eagle_worker_common.py"),
            remove)
    json_path = tmp_path / "races.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(tree), "--variant", "eagle_topk1_graph_plan", "--json",
                           str(json_path)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    document = json.loads(json_path.read_text()) if json_path.exists() else {}
    return done.returncode, done.stdout + done.stderr, document


@pytest.mark.slow
def test_tree_without_the_verify_plan_wait_races_in_its_own_file(tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    status, output, document = _tree_command(tmp_path, remove=True)
    assert status == 1, output
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    tree = tmp_path / "tree/sglang/srt"
    assert any(s["file"].startswith(str(tree)) for s in sides), output


@pytest.mark.slow
def test_tree_with_the_verify_plan_wait_is_race_free(tmp_path):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    status, output, document = _tree_command(tmp_path, remove=False)
    assert status == 0, output
    assert document["races"] == []
