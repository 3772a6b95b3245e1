"""SGLang's multi-layer EAGLE worker (``MultiLayerEagleWorkerV2``: MTP models' draft layers,
one runner per draft step) inside its own ``event_loop_overlap``, under the recorder.

The finding (docs/findings.md): with the plan stream on, its ``_draft_extend_for_decode``
queues the draft extend's preparation (``prepare_for_draft_extend``) on the plan stream
waiting only on the boundary-KV event, which it records only when the boundary-KV window is
on (``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX`` with a hybrid model's pool); without it the plan
stream waits for nothing, while the single-layer worker waits for the forward stream there
since 0.5.22. Both ways: the worker as released races (a plan-stream side inside
``prepare_for_draft_extend``, and sides in ``multi_layer_eagle_worker_v2.py``), and the tree
with that one wait written in (over the blank line above ``with self.plan_stream_ctx:``,
every line keeping its number) is race-free. With the plan stream off it is race-free as
released. Every verdict is the detector's.

One child process runs both variants on the installed SGLang; slow tests run the command on
a tree copy as released and with the fix, and on every supported release (fetched into the
user's cache): a release without the worker would be ``not_applicable`` by feature.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from tests.engines.sglang_trees import (
    edited_tree,
    line_replaced,
    release_package,
    release_versions,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)

WORKER_FILE = "srt/speculative/multi_layer_eagle_worker_v2.py"
COMMON_FILE = "srt/speculative/eagle_worker_common.py"
VARIANTS = ("multi_layer_eagle", "multi_layer_eagle_plan_off")
#: SGLang's single-layer worker's wait (eagle_worker_v2.py, 0.5.22 on), on one line
PLAN_WAIT = ("if self.plan_stream: self.plan_stream.wait_stream("
             "torch.get_device_module(self.device).current_stream())")

CHILD = """
import json
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
out = {}
for name in json.loads(sys.argv[1]):
    run = run_variant(VARIANTS[name])
    worker = run.scheduler.draft_worker
    out[name] = {"races": [race_record(r, name) for r in run.races],
                 "worker": type(worker).__name__,
                 "draft_worker": type(worker.draft_worker).__name__,
                 "step_forwards": [r.forwards for r in worker.draft_worker.draft_runner_list],
                 "target_forwards": run.forwards, "unknown": run.unknown_ops,
                 "plan_ops": sum(r.agent == "plan_stream"
                                 for r in run.watch.recording.timeline),
                 "rotations": sum(r.name == "rotate_input_ids_kernel"
                                  for r in run.watch.recording.timeline),
                 "finished": [q.finished() for q in run.requests]}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, list(VARIANTS))


def _function_lines(path: Path, name: str) -> range:
    """The lines of the function ``name`` in ``path`` (found by its syntax tree)."""
    node = next(n for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.FunctionDef) and n.name == name)
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _installed(relative: str) -> Path:
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / relative


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.engine_run
def test_sglangs_multi_layer_worker_runs_every_draft_step(runs, variant):
    """SGLang's own MultiLayerEagleWorkerV2 drives the loop: each draft step's runner ran a
    forward per prefill and per decode (3 steps), every request finished, every kernel on
    the path is declared."""
    run = runs[variant]
    assert run["worker"] == "MultiLayerEagleWorkerV2"
    assert run["draft_worker"] == "MultiLayerEagleDraftWorker"
    assert len(run["step_forwards"]) == 3
    assert len(set(run["step_forwards"])) == 1 and run["step_forwards"][0] >= 4
    assert run["step_forwards"][0] == run["target_forwards"]  # one draft pass per forward
    assert run["rotations"] >= 3 * run["target_forwards"]
    assert run["unknown"] == [] and all(run["finished"]) and len(run["finished"]) == 4


@pytest.mark.engine_run
def test_plan_stream_on_races_as_released(runs):
    """Plan stream on: races, each with a side on the plan stream; a plan-stream side inside
    prepare_for_draft_extend (what the worker queues there) and sides in the worker's file."""
    races = runs["multi_layer_eagle"]["races"]
    assert races
    assert all("plan_stream" in (r["first"]["stream"], r["second"]["stream"]) for r in races)
    prep = _function_lines(_installed(COMMON_FILE), "prepare_for_draft_extend")
    sides = [side for r in races for side in (r["first"], r["second"])]
    assert any(s["stream"] == "plan_stream" and s["file"] == str(_installed(COMMON_FILE))
               and s["line"] in prep for s in sides)
    extend = _function_lines(_installed(WORKER_FILE), "_draft_extend_for_decode")
    assert any(s["file"] == str(_installed(WORKER_FILE)) and s["line"] in extend
               for s in sides)


@pytest.mark.engine_run
def test_plan_stream_off_is_race_free_as_released(runs):
    run = runs["multi_layer_eagle_plan_off"]
    assert run["races"] == []
    assert run["plan_ops"] == 0  # nothing queued on a plan stream: there is none


def with_plan_wait(text: str) -> str:
    """The plan stream made to wait for the current (forward) stream before the draft
    extend's preparation, written over the blank line above the ``with
    self.plan_stream_ctx:`` that opens with the boundary-KV wait (every line keeps its
    number)."""
    lines = text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines)
                 if line.strip() == "with self.plan_stream_ctx:"
                 and "boundary_kv_ready_event" in lines[i + 1])
    assert lines[index - 1].strip() == "", lines[index - 1]
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    lines[index - 1] = f"{indent}{PLAN_WAIT}\n"
    return "".join(lines)


def _plan_waits(path: Path) -> int:
    """How many ``self.plan_stream.wait_stream(`` calls the worker's file has."""
    return sum("self.plan_stream.wait_stream(" in line for line in path.read_text().splitlines())


def _command(tmp_path: Path, package: Path | None, fix: bool) -> tuple[int, str, dict, Path]:
    tree = edited_tree(tmp_path, WORKER_FILE, with_plan_wait if fix else unchanged,
                       package=package)
    status, output, document = run_sglang("--sglang-src", str(tree),
                                          *(w for v in VARIANTS for w in ("--variant", v)),
                                          json_path=tmp_path / "races.json", timeout=900)
    return status, output, document, tree


def _check_released(status: int, output: str, document: dict, tree: Path) -> None:
    assert status == 1, output
    assert document["variants"] == list(VARIANTS), output
    races = document["races"]
    assert races and {r["variant"] for r in races} == {"multi_layer_eagle"}, output
    worker = tree / "sglang" / WORKER_FILE
    assert _plan_waits(worker) == 0  # as released: no wait for the forward stream
    sides = [side for r in races for side in (r["first"], r["second"])]
    assert any(s["stream"] == "plan_stream" for s in sides), output
    assert any(s["file"] == f"sglang/{WORKER_FILE}" for s in sides), output  # the tree's


def _verify_waits_for_the_forward_stream(tree: Path) -> bool:
    """Whether the tree's ``run_eagle_verify`` makes the plan stream wait for the forward
    stream before the verify's preparation (SGLang added it in 0.5.20: the verify finding of
    docs/findings.md), read from the tree's own source."""
    common = tree / "sglang" / COMMON_FILE
    verify = next(n for n in ast.walk(ast.parse(common.read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "run_eagle_verify")
    return "plan_stream.wait_stream(fwd_stream)" in ast.unparse(verify)


def _check_fixed(status: int, output: str, document: dict, tree: Path) -> None:
    """The one-line fix removes every race of the draft extend's preparation. A release
    whose verify does not wait for the forward stream either (0.5.17-0.5.19) keeps that
    finding's races alone: each with its plan-stream side in the verify's preparation
    (``eagle_prepare_for_verify``), none in the draft extend's."""
    assert _plan_waits(tree / "sglang" / WORKER_FILE) == 1
    assert document["variants"] == list(VARIANTS), output
    if _verify_waits_for_the_forward_stream(tree):
        assert status == 0, output
        assert document["races"] == [], output
        return
    assert status == 1, output
    utils = tree / "sglang/srt/speculative/eagle_utils.py"
    verify_prep = _function_lines(utils, "eagle_prepare_for_verify")
    extend_prep = _function_lines(tree / "sglang" / COMMON_FILE, "prepare_for_draft_extend")
    for race in document["races"]:
        plan = [s for s in (race["first"], race["second"]) if s["stream"] == "plan_stream"]
        assert plan and all(Path(s["file"]).name == "eagle_utils.py"
                            and s["line"] in verify_prep for s in plan), race
        assert not any(Path(s["file"]).name == "eagle_worker_common.py"
                       and s["line"] in extend_prep for s in plan), race


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_as_released_races_in_the_workers_file(tmp_path):
    _check_released(*_command(tmp_path, None, fix=False))


@pytest.mark.slow
@pytest.mark.engine_run
def test_tree_with_the_plan_wait_is_race_free(tmp_path):
    _check_fixed(*_command(tmp_path, None, fix=True))


@pytest.mark.slow
@pytest.mark.engine_run
@pytest.mark.parametrize("version", release_versions())
@pytest.mark.parametrize("fix", [False, True], ids=["released", "fixed"])
def test_every_release_both_ways(tmp_path, version, fix):
    """Every supported release has the worker and its missing wait: as released it races
    (plan stream on; off race-free); with the one-line fix both variants are race-free, but
    for the verify's own missing wait on releases before 0.5.20 (:func:`_check_fixed`)."""
    result = _command(tmp_path, release_package(version), fix=fix)
    (_check_fixed if fix else _check_released)(*result)



def _worker_renamed(text: str) -> str:
    """The worker's class under another name (as a release without the worker has none)."""
    assert "class MultiLayerEagleWorkerV2(" in text
    return text.replace("class MultiLayerEagleWorkerV2(", "class MultiLayerEagleWorkerElsewhere(")


@pytest.mark.engine_run
def test_a_tree_without_the_worker_lists_its_variants_not_applicable(tmp_path):
    """Found by module and class, never by version: both multi-layer variants are not
    applicable, named with the missing name; another variant runs."""
    tree = edited_tree(tmp_path, WORKER_FILE, _worker_renamed)
    status, output, document = run_sglang(
        "--sglang-src", str(tree), "--variant", "multi_layer_eagle", "--variant",
        "multi_layer_eagle_plan_off", "--variant", "idle_iteration",
        json_path=tmp_path / "races.json", timeout=900)
    assert status == 0, output
    assert document["variants"] == ["idle_iteration"]
    missing = {entry["variant"]: entry["reason"] for entry in document["not_applicable"]}
    assert set(missing) == set(VARIANTS), output
    assert all("multi_layer_eagle_worker_v2 has no MultiLayerEagleWorkerV2" in reason
               for reason in missing.values()), missing


# -- why the WAR barrier's fallback wait is necessary on 0.5.20 and not on 0.5.22 ----------

SCHEDULER_FILE = "srt/managers/scheduler.py"
FALLBACK_WAIT = "self.schedule_stream.wait_stream(self.forward_stream)"
SKIP_FINISHING = "self.enable_skip_finishing_decode = True"


def _scheduler_edit(skip_finishing: bool, fallback: bool):
    """The scheduler with 0.5.22's skip of finishing decodes on or off
    (``event_loop_overlap``'s switch) and the WAR barrier's fallback wait kept or made a
    ``pass`` (every line keeps its number)."""
    def edit(text: str) -> str:
        assert SKIP_FINISHING in text, "the tree has no skip of finishing decodes"
        if not skip_finishing:
            text = line_replaced(SKIP_FINISHING, "self.enable_skip_finishing_decode = False")(
                text)
        if not fallback:
            text = statement_passed("_apply_war_barrier", FALLBACK_WAIT)(text)
        return text
    return edit


@pytest.mark.slow
@pytest.mark.engine_run
@pytest.mark.parametrize("skip_finishing,fallback,races",
                         [(True, False, False), (False, False, True), (False, True, False)],
                         ids=["skip-no_fallback", "no_skip-no_fallback", "no_skip-fallback"])
def test_the_skip_of_finishing_decodes_hides_the_fallback_waits_necessity(
        tmp_path, skip_finishing, fallback, races):
    """docs/sglang-loop.md (0.5.20's loop report): without the WAR barrier's fallback wait
    (``_apply_war_barrier``) multi_layer_eagle_plan_off races on 0.5.20 and not on 0.5.22.
    The difference is the scheduler's skip of decodes whose queued result finishes them by
    length (0.5.22's ``_reqs_finishing_inflight``): on the installed tree, with it off and
    the fallback removed the plan-off loop races as 0.5.20's does (the overlapped extra
    decode's reads of a finished request's row against the next prefill's
    ``write_req_to_token_pool_triton`` on the schedule stream), with the fallback kept it is
    race-free, and with the skip on (as released) the removal is not seen."""
    tree = edited_tree(tmp_path, SCHEDULER_FILE, _scheduler_edit(skip_finishing, fallback))
    status, output, document = run_sglang("--sglang-src", str(tree), "--variant",
                                          "multi_layer_eagle_plan_off",
                                          json_path=tmp_path / "races.json", timeout=900)
    assert document["variants"] == ["multi_layer_eagle_plan_off"], output
    if not races:
        assert status == 0 and document["races"] == [], output
        return
    assert status == 1 and document["races"], output
    for race in document["races"]:
        assert race["kind"] == "WAR" and "req_to_token" in race["tensor"], race
        assert race["first"]["stream"] == "self.forward_stream", race
        assert race["second"]["stream"] == "self.schedule_stream", race
        assert race["second"]["op"] == "write_req_to_token_pool_triton", race
