"""The multi-layer EAGLE worker's boundary-KV window (features/boundary_kv.py) under its
draft-extend CUDA graphs (features/multi_layer_draft_extend_graph.py), inside SGLang's own
loop, under the recorder.

SGLang's draft-extend graph runners capture each request widened by the window
(``captured_req_width``: the chain's ``num_steps + 1`` rows plus the worker's
``draft_extend_num_front_tokens``) and replay a batch only when its
``spec_info.num_tokens_per_req`` is that width (``can_run_graph``); the worker's
``_draft_extend_for_decode`` sets it to the widened width, so every decode's widened draft
extend replays (nothing falls back to eager). What the released code does there: ordered,
as in the eager draft extend. The graph path builds its ``ForwardBatch`` in the same
plan-stream block, behind the same wait on ``boundary_kv_ready_event``; the runner's
``prepare`` copies the window's slots and positions into its static buffers on the forward
stream after the join. Both ways, every verdict the detector's: as released race-free with
the plan stream on and off (0.5.20 on; 0.5.17-0.5.19 keep only the verify's own missing
wait), and with that one wait made a ``pass`` the plan-on variants race inside
``prepare_for_draft_extend``, the plan-off ones (where the line never runs) stay race-free.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.sglang_trees import (
    edited_tree,
    release_package,
    release_versions,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)
from tests.engines.test_sglang_multi_layer_boundary_kv import (
    BOUNDARY_WAIT,
    COMMON_FILE,
    WINDOW_KERNELS,
    WORKER_FILE,
    _function_lines,
    _verify_waits_for_the_forward_stream,
)
from tests.engines.test_sglang_multi_layer_eagle_graph import (
    ONE_GRAPH,
    PER_STEP,
    VERIFY_PREP_FILES,
)

#: variant -> the runner class SGLang picks for it
RUNNERS = {"multi_layer_eagle_boundary_kv_graph": ONE_GRAPH,
           "multi_layer_eagle_boundary_kv_graph_plan_off": ONE_GRAPH,
           "multi_layer_eagle_boundary_kv_step_graphs": PER_STEP,
           "multi_layer_eagle_boundary_kv_step_graphs_plan_off": PER_STEP}
VARIANTS = tuple(RUNNERS)
PLAN_ON = ("multi_layer_eagle_boundary_kv_graph", "multi_layer_eagle_boundary_kv_step_graphs")
#: the eager window variant the graph variants are held against
EAGER = "multi_layer_eagle_boundary_kv_plan_off"
STEP_IN_GRAPH = "multi_layer_draft_extend_step_in_graph"

CHILD = """
import json
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
out = {}
for name in json.loads(sys.argv[1]):
    run = run_variant(VARIANTS[name])
    draft = run.scheduler.draft_worker.draft_worker
    runner = draft.cuda_graph_runner_for_draft_extend
    names = [r.name for r in run.watch.recording.timeline]
    out[name] = {"races": [race_record(r, name) for r in run.races],
                 "runner": type(runner).__name__,
                 "width": None if runner is None else runner.captured_req_width,
                 "runner_front": None if runner is None else runner.num_front_tokens,
                 "front": draft.draft_extend_num_front_tokens,
                 "steps": draft.speculative_num_steps,
                 "eager_step_forwards": [r.forwards for r in draft.draft_runner_list],
                 "target_forwards": run.forwards, "unknown": run.unknown_ops,
                 "step_replays": sum(n.startswith("graph.replay: STEP") for n in names),
                 "fills": names.count("fill_draft_extend_prepare_buffers"),
                 "window_kernels": [names.count(k) for k in json.loads(sys.argv[2])],
                 "plan_ops": sum(r.agent == "plan_stream"
                                 for r in run.watch.recording.timeline),
                 "outputs": [list(q.output_ids) for q in run.requests],
                 "finished": [q.finished() for q in run.requests]}
print("RESULT", json.dumps(out))
""".replace("STEP", STEP_IN_GRAPH)


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, [*VARIANTS, EAGER], list(WINDOW_KERNELS))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.engine_run
def test_sglangs_runner_replays_every_widened_draft_extend(runs, variant):
    """SGLang turned the window on (front = steps - 1 + the conv's 2 warm-up rows) and its
    runner captured the widened width; each decode computed and filled its window and its
    draft extend was one prepare and one replay per step (3): none fell back to eager (the
    prefills' draft extends stay eager: 2 forwards per step runner); every request
    finished with the eager window variant's tokens and forward count; nothing undeclared."""
    run, eager = runs[variant], runs[EAGER]
    assert run["runner"] == RUNNERS[variant]
    assert run["front"] == run["steps"] - 1 + 2 == run["runner_front"]
    assert run["width"] == run["steps"] + 1 + run["front"]
    decodes = run["target_forwards"] - 2
    assert decodes >= 4
    assert run["eager_step_forwards"] == [2, 2, 2]
    assert run["fills"] == decodes and run["step_replays"] == 3 * decodes
    locs, fills, stash = run["window_kernels"]
    assert locs == fills == decodes and stash > decodes
    assert (run["outputs"], run["target_forwards"]) == (eager["outputs"],
                                                       eager["target_forwards"])
    assert run["unknown"] == [] and all(run["finished"]) and len(run["finished"]) == 4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.engine_run
def test_the_window_under_the_graphs_is_race_free_as_released(runs, variant):
    assert runs[variant]["races"] == []
    assert (runs[variant]["plan_ops"] > 0) == (variant in PLAN_ON)


def _command(tmp_path: Path, package: Path | None, wait_removed: bool
             ) -> tuple[int, str, dict, Path]:
    edit = (statement_passed("_draft_extend_for_decode", BOUNDARY_WAIT) if wait_removed
            else unchanged)
    tree = edited_tree(tmp_path, WORKER_FILE, edit, package=package)
    status, output, document = run_sglang("--sglang-src", str(tree),
                                          *(w for v in VARIANTS for w in ("--variant", v)),
                                          json_path=tmp_path / "races.json", timeout=900)
    return status, output, document, tree


def _check_released(status: int, output: str, document: dict, tree: Path) -> None:
    """Race-free; on a release whose verify does not wait for the forward stream
    (0.5.17-0.5.19), that finding's races alone, in the plan-on variants: every plan-stream
    side in the verify's preparation (eagle_prepare_for_verify, the verify graph's
    load_batch copies), none in the draft extend's."""
    assert document["variants"] == list(VARIANTS), output
    assert sum(BOUNDARY_WAIT in line for line in
               (tree / "sglang" / WORKER_FILE).read_text().splitlines()) == 1
    if _verify_waits_for_the_forward_stream(tree):
        assert (status, document["races"]) == (0, []), output
        return
    assert status == 1, output
    assert {r["variant"] for r in document["races"]} == set(PLAN_ON), output
    extend_prep = _function_lines(tree / "sglang" / COMMON_FILE, "prepare_for_draft_extend")
    for race in document["races"]:
        plan = [s for s in (race["first"], race["second"]) if s["stream"] == "plan_stream"]
        assert plan and all(Path(s["file"]).name in VERIFY_PREP_FILES for s in plan), race
        assert not any(s["file"] == f"sglang/{COMMON_FILE}" and s["line"] in extend_prep
                       for s in plan), race


def _check_wait_removed(status: int, output: str, document: dict, tree: Path) -> None:
    """The plan-on variants race with a plan-stream side in prepare_for_draft_extend (the
    graph path's ForwardBatch, built in the plan-stream block); the plan-off ones, where
    the line never runs, are race-free."""
    assert status == 1, output
    assert document["variants"] == list(VARIANTS), output
    races = document["races"]
    assert {r["variant"] for r in races} == set(PLAN_ON), output
    prep = _function_lines(tree / "sglang" / COMMON_FILE, "prepare_for_draft_extend")
    for variant in PLAN_ON:
        sides = [s for r in races if r["variant"] == variant for s in (r["first"], r["second"])]
        assert any(s["stream"] == "plan_stream" and s["file"] == f"sglang/{COMMON_FILE}"
                   and s["line"] in prep for s in sides), variant


@pytest.mark.engine_run
def test_the_tree_with_the_boundary_wait_removed_races(tmp_path):
    _check_wait_removed(*_command(tmp_path, None, wait_removed=True))


@pytest.mark.slow
@pytest.mark.engine_run
@pytest.mark.parametrize("version", release_versions())
@pytest.mark.parametrize("wait_removed", [False, True], ids=["released", "wait_removed"])
def test_every_release_both_ways(tmp_path, version, wait_removed):
    """Every supported release's runners capture the widened width and its worker has the
    wait: as released ordered (but for the verify's own missing wait before 0.5.20), with
    the wait removed racing."""
    result = _command(tmp_path, release_package(version), wait_removed=wait_removed)
    (_check_wait_removed if wait_removed else _check_released)(*result)


@pytest.mark.parametrize("version", release_versions())
def test_every_release_captures_the_widened_width(version):
    """Read from each release's own source (no import): the per-step runner's __init__
    widens its capture width by the worker's front rows, and its can_run_graph compares the
    batch's width with it (the check the widened draft extend passes)."""
    import ast

    runner = (release_package(version)
              / "srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py")
    tree = ast.parse(runner.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
               and n.name == "MultiLayerEagleDraftExtendCudaGraphRunner")
    methods = {n.name: ast.unparse(n) for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert "eagle_worker.draft_extend_num_front_tokens" in methods["__init__"]
    assert "+ self.num_front_tokens" in methods["__init__"]
    assert "num_tokens_per_req != self.captured_req_width" in methods["can_run_graph"]


def test_the_window_graph_variants_need_both_features():
    """Found by feature: each window graph variant needs the window's release features and
    its runner class (release_features), and says boundary_kv=on with its graph switch."""
    from overlap_harness.engines.sglang import release_features as rf
    from overlap_harness.engines.sglang.configurations import configuration
    from overlap_harness.engines.sglang.variants import VARIANTS as ALL

    for name, runner in RUNNERS.items():
        needs = rf.required_features(ALL[name])
        assert {rf.MULTI_LAYER_BOUNDARY_KV, rf.HYBRID_REQUEST_POOL, rf.MULTI_LAYER_EAGLE} \
            <= set(needs), name
        graph_needs = [f for f in needs if f.module == rf.MULTI_LAYER_DRAFT_EXTEND_GRAPHS.module]
        assert [f.name for f in graph_needs] == [runner], name
        config = configuration(ALL[name])
        assert config["boundary_kv"] == "on"
        assert config["single_cg_draft"] == ("on" if runner == ONE_GRAPH else "off")
