"""The multi-layer EAGLE worker's boundary-KV window (``SGLANG_ENABLE_MTP_BOUNDARY_KV_FIX``
with a hybrid model's pool: features/boundary_kv.py) inside SGLang's own loop, under the
recorder.

What SGLang's released code does with it (docs/findings.md): ordered. With the window on,
``_draft_extend_for_decode`` records ``boundary_kv_ready_event`` on the forward stream after
computing the window's KV slots and makes the plan stream wait on it before the draft
extend's preparation: that wait orders the whole plan-stream block after the forward stream,
what the window-off path lacks (the multi-layer finding). Both ways, every verdict the
detector's: the tree as released is race-free with the plan stream on and off (0.5.20 on;
0.5.17-0.5.19 keep only the verify's own missing wait, a finding of its own), and the same
tree with that one wait made a ``pass`` races on the plan stream inside
``prepare_for_draft_extend``; with the plan stream off that line never runs, and the variant
stays race-free.

The stand-ins' own checks (no loop): the hybrid pool view is strict and shows the scheduler's
``req_to_token``; each declared kernel's CPU values against values worked out by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from tests.engines.sglang_trees import (
    edited_tree,
    release_package,
    release_versions,
    run_child,
    run_sglang,
    statement_passed,
    unchanged,
)

WORKER_FILE = "srt/speculative/multi_layer_eagle_worker_v2.py"
COMMON_FILE = "srt/speculative/eagle_worker_common.py"
VARIANTS = ("multi_layer_eagle_boundary_kv", "multi_layer_eagle_boundary_kv_plan_off")
BOUNDARY_WAIT = "self.plan_stream.wait_event(boundary_kv_ready_event)"
WINDOW_KERNELS = ("compute_widened_draft_extend_locs_positions_kernel",
                  "fill_widened_draft_extend_inputs_kernel", "stash_append_boundary_state_kernel")

CHILD = """
import json
from overlap_harness.engines.core.results import race_record
from overlap_harness.engines.sglang.driver import run_variant
from overlap_harness.engines.sglang.variants import VARIANTS
out = {}
for name in json.loads(sys.argv[1]):
    run = run_variant(VARIANTS[name])
    draft = run.scheduler.draft_worker.draft_worker
    ops = {}
    for record in run.watch.recording.timeline:
        ops[record.name] = ops.get(record.name, 0) + 1
    out[name] = {"races": [race_record(r, name) for r in run.races],
                 "pool": type(draft.req_to_token_pool).__mro__[1].__name__,
                 "front": draft.draft_extend_num_front_tokens,
                 "warmup": draft.draft_extend_num_warmup_tokens,
                 "steps": draft.speculative_num_steps,
                 "step_forwards": [r.forwards for r in draft.draft_runner_list],
                 "target_forwards": run.forwards, "unknown": run.unknown_ops, "ops": ops,
                 "plan_ops": sum(r.agent == "plan_stream"
                                 for r in run.watch.recording.timeline),
                 "finished": [q.finished() for q in run.requests]}
print("RESULT", json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    return run_child(CHILD, list(VARIANTS))


def _function_lines(path: Path, name: str) -> range:
    node = next(n for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.FunctionDef) and n.name == name)
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.engine_run
def test_sglang_turns_the_window_on_and_runs_it(runs, variant):
    """SGLang's own _init_boundary_kv_fix_state accepted the hybrid pool: front rows =
    steps - 1 + the conv state's warm-up (2); the window's kernels ran, every decode's draft
    extend computed and filled its window, every request finished, nothing undeclared."""
    run = runs[variant]
    assert run["pool"] == "HybridReqToTokenPool"
    assert run["warmup"] == 2 and run["front"] == run["steps"] - 1 + 2
    counts = [run["ops"].get(name, 0) for name in WINDOW_KERNELS]
    assert counts[0] == counts[1] >= 4  # one widened window per decode
    assert counts[2] > counts[0]  # the prefills seed the stash, every decode rolls it
    assert len(set(run["step_forwards"])) == 1
    assert run["step_forwards"][0] == run["target_forwards"]
    assert run["unknown"] == [] and all(run["finished"]) and len(run["finished"]) == 4


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.engine_run
def test_the_window_is_race_free_as_released(runs, variant):
    assert runs[variant]["races"] == []


@pytest.mark.engine_run
def test_the_plan_stream_runs_the_preparation_only_with_it_on(runs):
    assert runs["multi_layer_eagle_boundary_kv"]["plan_ops"] > 0
    assert runs["multi_layer_eagle_boundary_kv_plan_off"]["plan_ops"] == 0


def _command(tmp_path: Path, package: Path | None, wait_removed: bool
             ) -> tuple[int, str, dict, Path]:
    edit = (statement_passed("_draft_extend_for_decode", BOUNDARY_WAIT) if wait_removed
            else unchanged)
    tree = edited_tree(tmp_path, WORKER_FILE, edit, package=package)
    status, output, document = run_sglang("--sglang-src", str(tree),
                                          *(w for v in VARIANTS for w in ("--variant", v)),
                                          json_path=tmp_path / "races.json", timeout=900)
    return status, output, document, tree


def _verify_waits_for_the_forward_stream(tree: Path) -> bool:
    """Whether the tree's ``run_eagle_verify`` makes the plan stream wait for the forward
    stream before the verify's preparation (SGLang added it in 0.5.20), from its source."""
    verify = next(n for n in ast.walk(ast.parse((tree / "sglang" / COMMON_FILE).read_text()))
                  if isinstance(n, ast.FunctionDef) and n.name == "run_eagle_verify")
    return "plan_stream.wait_stream(fwd_stream)" in ast.unparse(verify)


def _check_released(status: int, output: str, document: dict, tree: Path) -> None:
    """Race-free; on a release whose verify does not wait for the forward stream, that
    finding's races alone (plan-stream sides in eagle_prepare_for_verify, none in the draft
    extend's preparation), and only with the plan stream on."""
    assert document["variants"] == list(VARIANTS), output
    assert sum(BOUNDARY_WAIT in line for line in
               (tree / "sglang" / WORKER_FILE).read_text().splitlines()) == 1
    if _verify_waits_for_the_forward_stream(tree):
        assert status == 0, output
        assert document["races"] == [], output
        return
    assert status == 1, output
    assert {r["variant"] for r in document["races"]} == {VARIANTS[0]}, output
    verify_prep = _function_lines(tree / "sglang/srt/speculative/eagle_utils.py",
                                  "eagle_prepare_for_verify")
    for race in document["races"]:
        plan = [s for s in (race["first"], race["second"]) if s["stream"] == "plan_stream"]
        assert plan and all(Path(s["file"]).name == "eagle_utils.py"
                            and s["line"] in verify_prep for s in plan), race


def _check_wait_removed(status: int, output: str, document: dict, tree: Path) -> None:
    """The plan stream's draft-extend preparation races the forward stream, the plan-off
    twin (where the line never runs) stays race-free."""
    assert status == 1, output
    assert document["variants"] == list(VARIANTS), output
    races = document["races"]
    assert {r["variant"] for r in races} == {VARIANTS[0]}, output
    prep = _function_lines(tree / "sglang" / COMMON_FILE, "prepare_for_draft_extend")
    sides = [side for r in races for side in (r["first"], r["second"])]
    assert any(s["stream"] == "plan_stream" and s["file"] == f"sglang/{COMMON_FILE}"
               and s["line"] in prep for s in sides), output
    # the forward stream's side: the window's own kernels or the decode's draft steps
    assert any(s["stream"] == "self.forward_stream" and s["file"] == f"sglang/{WORKER_FILE}"
               for s in sides), output


@pytest.mark.engine_run
def test_the_tree_with_the_boundary_wait_removed_races(tmp_path):
    _check_wait_removed(*_command(tmp_path, None, wait_removed=True))


@pytest.mark.slow
@pytest.mark.engine_run
@pytest.mark.parametrize("version", release_versions())
@pytest.mark.parametrize("wait_removed", [False, True], ids=["released", "wait_removed"])
def test_every_release_both_ways(tmp_path, version, wait_removed):
    """Every supported release has the window and its wait: as released ordered (but for the
    verify's own missing wait before 0.5.20), with the wait removed racing."""
    result = _command(tmp_path, release_package(version), wait_removed=wait_removed)
    (_check_wait_removed if wait_removed else _check_released)(*result)


def _window_renamed(text: str) -> str:
    """The worker without the window's state (as a release without the window has none)."""
    assert "def _init_boundary_kv_fix_state(" in text
    return text.replace("def _init_boundary_kv_fix_state(", "def _init_elsewhere(").replace(
        "self._init_boundary_kv_fix_state()", "self._init_elsewhere()")


@pytest.mark.engine_run
def test_a_tree_without_the_window_lists_its_variants_not_applicable(tmp_path):
    """Found by the worker's method, never by version: both window variants are not
    applicable, named with the missing name; the window-off multi-layer variant runs."""
    tree = edited_tree(tmp_path, WORKER_FILE, _window_renamed)
    status, output, document = run_sglang(
        "--sglang-src", str(tree), *(w for v in VARIANTS for w in ("--variant", v)),
        "--variant", "multi_layer_eagle_plan_off", json_path=tmp_path / "races.json",
        timeout=900)
    assert status == 0, output
    assert document["variants"] == ["multi_layer_eagle_plan_off"]
    missing = {entry["variant"]: entry["reason"] for entry in document["not_applicable"]}
    assert set(missing) == set(VARIANTS), output
    assert all("MultiLayerEagleDraftWorker has no _init_boundary_kv_fix_state" in reason
               for reason in missing.values()), missing


# -- the stand-ins, without the loop -------------------------------------------------------


VIEW_CHILD = """
import json, torch
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError
from overlap_harness.engines.sglang.stand_ins.hybrid_pool import hybrid_pool_view
table = torch.zeros((3, 8), dtype=torch.int32)
view = hybrid_pool_view(StrictStub("plain", req_to_token=table, size=3))
refused = []
for name in json.loads(sys.argv[1]):
    try:
        getattr(view, name)
    except UnplannedUseError:
        refused.append(name)
try:
    view.size = 4
except UnplannedUseError:
    refused.append("size=")
print("RESULT", json.dumps({"hybrid": isinstance(view, HybridReqToTokenPool),
                            "same_table": view.req_to_token is table, "size": view.size,
                            "conv": list(view.mamba_pool.mamba_cache.conv[0].shape[2:]),
                            "refused": refused}))
"""


@pytest.mark.engine_run
def test_the_hybrid_pool_view_is_strict_and_shows_the_schedulers_table():
    """SGLang's HybridReqToTokenPool by class; the scheduler's table itself; a conv state of
    (window 2, dim 4); every other name (inherited methods too) and any setting refused."""
    names = ["alloc", "free", "mamba_allocator", "translate_mamba_indices"]
    result = run_child(VIEW_CHILD, names)
    assert result == {"hybrid": True, "same_table": True, "size": 3, "conv": [2, 4],
                      "refused": [*names, "size="]}


def test_the_widened_window_slots_and_positions():
    """One request at row 1, committed length 5, two valid stash pairs, W = 4, front 4, two
    warm-up rows: positions 1..8 with the two rows without data at 0; the front rows write
    the sacrificial slot 0, the others the row's slots at their positions."""
    from overlap_harness.engines.sglang.stand_ins import boundary_kv_kernels as k

    table = torch.arange(40, dtype=torch.int32).view(2, 20) + 100
    valid = torch.tensor([0, 2], dtype=torch.int32)
    locs, positions = k.widened_locs_positions(
        torch.tensor([5]), torch.tensor([1]), table, valid, 4, 4, 2)
    assert positions.tolist() == [0, 0, 3, 4, 5, 6, 7, 8]
    assert locs.tolist() == [0, 0, 0, 0, 125, 126, 127, 128]
    accesses = k.widened_locs_accesses((locs, positions), torch.tensor([5]), torch.tensor([1]),
                                       table, valid, 4, 4, 2)
    storage = table.untyped_storage().data_ptr()
    read_tables = [a.tensor for a in accesses if not a.write
                   and a.tensor.untyped_storage().data_ptr() == storage]
    assert [t.tolist() for t in read_tables] == [list(range(121, 129))]


def test_the_stash_rolls_and_the_window_is_filled_from_it():
    """Front 3: a prefill of 5 tokens seeds the stash with its last 3; a decode's window is
    those 3 and its W = 2 verify rows; accepting both rolls the two oldest pairs out; rows
    below the stash's valid pairs or the committed length are zeroed."""
    from overlap_harness.engines.sglang.stand_ins import boundary_kv_kernels as k

    front, hidden = 3, 2
    tokens = torch.zeros((1, front), dtype=torch.int64)
    hiddens = torch.zeros((1, front, hidden))
    valid = torch.zeros((1,), dtype=torch.int32)
    source = torch.tensor([10, 11, 12, 13, 14])
    source_h = source.to(torch.float32).view(-1, 1).repeat(1, hidden)
    k.stash_append(source, source_h, torch.tensor([5]), torch.tensor([5]), torch.tensor([0]),
                   tokens, hiddens, valid, set_valid=True)
    assert tokens.tolist() == [[12, 13, 14]] and valid.tolist() == [3]
    assert hiddens[0, :, 0].tolist() == [12.0, 13.0, 14.0]
    # the decode's window: W = 2 verify rows after the 3 front rows from the stash
    ids = torch.full((5,), -1, dtype=torch.int64)
    window_h = torch.full((5, hidden), -1.0)
    predict = torch.tensor([20, 21])
    verify_h = torch.tensor([[20.0, 20.0], [21.0, 21.0]])
    k.fill_widened_inputs(ids, window_h, predict, verify_h, tokens, hiddens, valid,
                          torch.tensor([5]), torch.tensor([0]), 2)
    assert ids.tolist() == [12, 13, 14, 20, 21]
    assert window_h[:, 0].tolist() == [12.0, 13.0, 14.0, 20.0, 21.0]
    # the decode accepted both rows: two pairs in, the two oldest out, valid stays 3
    k.stash_append(predict, verify_h, torch.tensor([2]), torch.tensor([2]), torch.tensor([0]),
                   tokens, hiddens, valid, set_valid=False)
    assert tokens.tolist() == [[14, 20, 21]] and valid.tolist() == [3]
    # a request with one valid pair and committed length 2: the first front row has no data
    valid.fill_(1)
    k.fill_widened_inputs(ids, window_h, predict, verify_h, tokens, hiddens, valid,
                          torch.tensor([2]), torch.tensor([0]), 2)
    assert ids.tolist() == [0, 0, 21, 20, 21]


def test_the_window_without_the_multi_layer_worker_is_refused():
    """The window is the multi-layer worker's: a variant that composes it with the
    single-layer worker is an error of the features; with the multi-layer worker its
    configuration says boundary_kv=on, and the multi-layer variants without it say off."""
    from overlap_harness.engines.sglang.configurations import configuration
    from overlap_harness.engines.sglang.features.boundary_kv import BoundaryKvWindow
    from overlap_harness.engines.sglang.features.eagle import Eagle
    from overlap_harness.engines.sglang.variants import VARIANTS as ALL
    from overlap_harness.engines.sglang.variants import Variant

    with pytest.raises(ValueError, match="BoundaryKvWindow needs MultiLayerEagle"):
        configuration(Variant("single_layer_window", 12, {}, (Eagle(), BoundaryKvWindow())))
    windows = {name: configuration(v).get("boundary_kv") for name, v in ALL.items()}
    # the eager ones and the four under the draft-extend graphs
    # (test_sglang_multi_layer_boundary_kv_graph.py)
    assert {name for name, value in windows.items() if value == "on"} == set(VARIANTS) | {
        f"multi_layer_eagle_boundary_kv_{graphs}{plan}" for graphs in ("graph", "step_graphs")
        for plan in ("", "_plan_off")}
    assert windows["multi_layer_eagle"] == windows["multi_layer_eagle_graph"] == "off"
    assert windows["eagle_topk1"] is None  # not a multi-layer variant: the key does not apply

