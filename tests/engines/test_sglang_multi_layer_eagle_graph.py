"""SGLang's multi-layer EAGLE worker with its draft extend under SGLang's own draft-extend
CUDA-graph runners (features/multi_layer_draft_extend_graph.py), inside its own
``event_loop_overlap``, under the recorder.

SGLang's ``_capture_cuda_graphs`` picks the runner: every draft step in one graph
(``OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner``, SGLANG_ENABLE_SINGLE_CG_DRAFT
on, its default) or one graph per step (``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner``).
The finding of the eager worker (docs/findings.md: ``_draft_extend_for_decode``'s plan-stream
block waits for nothing without the boundary-KV window) holds under the graphs too: the graph
path builds its ``ForwardBatch`` in the same block. Both ways: as released the plan-stream-on
variants race (a plan-stream side in ``prepare_for_draft_extend``), the tree with the one-line
wait (``test_sglang_multi_layer_eagle.with_plan_wait``) is race-free; plan stream off is
race-free as released. Every verdict is the detector's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.engines.sglang_trees import (
    edited_tree,
    release_package,
    release_versions,
    run_child,
    run_sglang,
    unchanged,
)
from tests.engines.test_sglang_multi_layer_eagle import (
    COMMON_FILE,
    WORKER_FILE,
    _function_lines,
    _installed,
    _plan_waits,
    _verify_waits_for_the_forward_stream,
    with_plan_wait,
)

ONE_GRAPH = "OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner"
PER_STEP = "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner"
#: variant -> the runner class SGLang picks for it
RUNNERS = {"multi_layer_eagle_graph": ONE_GRAPH, "multi_layer_eagle_graph_plan_off": ONE_GRAPH,
           "multi_layer_eagle_step_graphs": PER_STEP,
           "multi_layer_eagle_step_graphs_plan_off": PER_STEP}
PLAN_ON = ("multi_layer_eagle_graph", "multi_layer_eagle_step_graphs")
PLAN_OFF = ("multi_layer_eagle_graph_plan_off", "multi_layer_eagle_step_graphs_plan_off")
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
    names = [r.name for r in run.watch.recording.timeline]
    out[name] = {"races": [race_record(r, name) for r in run.races],
                 "runner": type(draft.cuda_graph_runner_for_draft_extend).__name__,
                 "eager_step_forwards": [r.forwards for r in draft.draft_runner_list],
                 "target_forwards": run.forwards, "unknown": run.unknown_ops,
                 "step_replays": sum(n.startswith("graph.replay: STEP") for n in names),
                 "fills": names.count("fill_draft_extend_prepare_buffers"),
                 "plan_ops": sum(r.agent == "plan_stream"
                                 for r in run.watch.recording.timeline),
                 "finished": [q.finished() for q in run.requests]}
print("RESULT", json.dumps(out))
""".replace("STEP", STEP_IN_GRAPH)


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, list(RUNNERS))


@pytest.mark.parametrize("variant", sorted(RUNNERS))
@pytest.mark.engine_run
def test_sglangs_runner_replays_every_draft_step(runs, variant):
    """SGLang picks the runner the variant's switch asks for; each decode's draft extend is
    one prepare and one replay per draft step (3), the prefills' draft extends stay eager
    (2 prefills: each step runner's two eager forwards), every request finishes, every
    kernel on the path is declared."""
    run = runs[variant]
    assert run["runner"] == RUNNERS[variant]
    decodes = run["target_forwards"] - 2
    assert decodes >= 4
    assert run["eager_step_forwards"] == [2, 2, 2]
    assert run["fills"] == decodes
    assert run["step_replays"] == 3 * decodes
    assert run["unknown"] == [] and all(run["finished"]) and len(run["finished"]) == 4


@pytest.mark.parametrize("variant", PLAN_ON)
@pytest.mark.engine_run
def test_plan_stream_on_races_as_released(runs, variant):
    """The eager worker's finding under the graphs: races, each with a side on the plan
    stream, one inside prepare_for_draft_extend (what the worker queues there)."""
    races = runs[variant]["races"]
    assert races
    assert all("plan_stream" in (r["first"]["stream"], r["second"]["stream"]) for r in races)
    prep = _function_lines(_installed(COMMON_FILE), "prepare_for_draft_extend")
    assert any(s["stream"] == "plan_stream" and s["file"] == str(_installed(COMMON_FILE))
               and s["line"] in prep for r in races for s in (r["first"], r["second"]))


@pytest.mark.parametrize("variant", PLAN_OFF)
@pytest.mark.engine_run
def test_plan_stream_off_is_race_free_as_released(runs, variant):
    run = runs[variant]
    assert run["races"] == []
    assert run["plan_ops"] == 0


def _command(tmp_path: Path, package: Path | None, fix: bool, variants: tuple[str, ...]
             ) -> tuple[int, str, dict, Path]:
    tree = edited_tree(tmp_path, WORKER_FILE, with_plan_wait if fix else unchanged,
                       package=package)
    status, output, document = run_sglang("--sglang-src", str(tree),
                                          *(w for v in variants for w in ("--variant", v)),
                                          json_path=tmp_path / "races.json", timeout=900)
    return status, output, document, tree


def _check_released(status: int, output: str, document: dict, tree: Path) -> None:
    assert status == 1, output
    assert document["variants"] == list(RUNNERS), output
    assert {r["variant"] for r in document["races"]} == set(PLAN_ON), output
    assert _plan_waits(tree / "sglang" / WORKER_FILE) == 0
    assert all("plan_stream" in (r["first"]["stream"], r["second"]["stream"])
               for r in document["races"]), output


#: where the verify's preparation runs on the plan stream under the verify graph: SGLang's
#: eagle_prepare_for_verify and the graph runner's load_batch, whose static-buffer copies
#: are the buffer registry's
VERIFY_PREP_FILES = {"eagle_utils.py", "cuda_graph_buffer_registry.py"}


def _check_fixed(status: int, output: str, document: dict, tree: Path) -> None:
    """With the wait, race-free; a release whose verify does not wait for the forward stream
    either (0.5.17-0.5.19) keeps that finding's races alone: each plan-stream side in the
    verify's preparation (eagle_prepare_for_verify, load_batch's copies), none in the draft
    extend's."""
    assert _plan_waits(tree / "sglang" / WORKER_FILE) == 1
    assert document["variants"] == list(PLAN_ON), output
    if _verify_waits_for_the_forward_stream(tree):
        assert (status, document["races"]) == (0, []), output
        return
    assert status == 1, output
    extend_prep = _function_lines(tree / "sglang" / COMMON_FILE, "prepare_for_draft_extend")
    for race in document["races"]:
        plan = [s for s in (race["first"], race["second"]) if s["stream"] == "plan_stream"]
        assert plan and all(Path(s["file"]).name in VERIFY_PREP_FILES for s in plan), race
        assert not any(Path(s["file"]).name == "eagle_worker_common.py"
                       and s["line"] in extend_prep for s in plan), race


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_as_released_races_and_with_the_wait_is_race_free(tmp_path):
    """The installed tree both ways: as released the plan-on variants race (exit 1); with
    the one-line wait they are race-free (exit 0 on 0.5.20 on)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    for name in ("released", "fixed"):
        (tmp_path / name).mkdir()
    _check_released(*_command(tmp_path / "released", None, False, tuple(RUNNERS)))
    _check_fixed(*_command(tmp_path / "fixed", None, True, PLAN_ON))


@pytest.mark.slow
@pytest.mark.engine_run
@pytest.mark.parametrize("version", release_versions())
@pytest.mark.parametrize("fix", [False, True], ids=["released", "fixed"])
def test_every_release_both_ways(tmp_path, version, fix):
    """Every supported release has both runners and the missing wait."""
    variants = PLAN_ON if fix else tuple(RUNNERS)
    result = _command(tmp_path, release_package(version), fix, variants)
    (_check_fixed if fix else _check_released)(*result)


def test_release_needs_follow_the_runner_switch():
    """Found by feature: the one-graph variants need the one-graph runner class, the
    per-step ones the per-step class (release_features names each by module and class)."""
    from overlap_harness.engines.sglang import release_features as rf
    from overlap_harness.engines.sglang.variants import VARIANTS

    for name, runner in RUNNERS.items():
        needs = rf.required_features(VARIANTS[name])
        graph_needs = [f for f in needs if f.module == rf.MULTI_LAYER_DRAFT_EXTEND_GRAPHS.module]
        assert [f.name for f in graph_needs] == [runner], name
        assert rf.MULTI_LAYER_EAGLE in needs, name


@pytest.mark.parametrize("version", release_versions())
def test_every_release_defines_both_runner_classes(version):
    """Read from each release's own source (no import): the runner module defines both
    classes the features need, and the worker's _capture_cuda_graphs reads
    SGLANG_ENABLE_SINGLE_CG_DRAFT to pick between them."""
    import ast

    package = release_package(version)
    runner = package / "srt/speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py"
    classes = {n.name for n in ast.walk(ast.parse(runner.read_text()))
               if isinstance(n, ast.ClassDef)}
    assert {ONE_GRAPH, PER_STEP} <= classes
    worker = ast.parse((package / WORKER_FILE).read_text())
    capture = next(n for n in ast.walk(worker)
                   if isinstance(n, ast.FunctionDef) and n.name == "_capture_cuda_graphs")
    assert "SGLANG_ENABLE_SINGLE_CG_DRAFT" in ast.unparse(capture)
