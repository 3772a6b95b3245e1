"""SGLang releases other than the installed one: stub modules, variants a release cannot run,
a variant that cannot be driven beside others that can, and an older release's own tree.

Runs are child processes of ``overlap-harness sglang`` (as a user runs it) on trees that
mirror a real SGLang package with symlinks, except the one file a test edits (a real copy).
The verdicts, the not-applicable reasons and the error messages are the command's.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from overlap_harness.engines.core.strict import StrictName, UnplannedUseError, strict_module
from overlap_harness.engines.sglang.stand_ins import torchvision as torchvision_stub
from tests.engines.sglang_trees import edited_tree, installed_sglang, run_sglang

ROOT = Path(__file__).resolve().parents[2]
FORWARD_WAIT = "self.forward_stream.wait_stream(self.schedule_stream)"


def test_an_open_stub_module_answers_any_name_that_fails_when_used():
    module = strict_module("fakevision.io", "stand-in", {"known": 1}, open_names=True)
    assert module.known == 1
    name = module.decode_jpeg  # what `from fakevision.io import decode_jpeg` takes
    assert isinstance(name, StrictName)
    assert isinstance(name.ImageReadMode.RGB, StrictName)  # a default argument's value
    with pytest.raises(UnplannedUseError, match=r"fakevision\.io\.decode_jpeg called"):
        name(b"bytes")
    with pytest.raises(UnplannedUseError, match="tested for truth"):
        bool(name)
    with pytest.raises(UnplannedUseError, match="iterated"):
        list(name)
    with pytest.raises(AttributeError):
        getattr(module, "__wrapped__")  # noqa: B009 (protocol probes stay plain misses)


def test_a_closed_stub_module_still_refuses_unknown_names():
    module = strict_module("fakevision.io", "stand-in", {})
    with pytest.raises(UnplannedUseError, match="not in the stub module"):
        getattr(module, "decode_jpeg")  # noqa: B009


def test_the_torchvision_stub_answers_names_older_releases_import():
    modules = {m.__name__: m for m in torchvision_stub._modules()}
    decode = modules["torchvision.io"].decode_jpeg
    normalize = modules["torchvision.transforms"].Normalize
    assert modules["torchvision.transforms"].InterpolationMode.BICUBIC.value == "bicubic"
    with pytest.raises(UnplannedUseError, match=r"torchvision\.io\.decode_jpeg called"):
        decode(None)
    with pytest.raises(UnplannedUseError, match=r"torchvision\.transforms\.Normalize called"):
        normalize(mean=0, std=1)


_installed_package = installed_sglang


def _tree(tmp_path: Path, package: Path, relative: str, edit: Callable[[str], str],
          name: str = "tree") -> Path:
    return edited_tree(tmp_path, relative, edit, package=package, name=name)


def _command(tree: Path, *variants: str, json_path: Path) -> tuple[int, str, dict]:
    args = [word for v in variants for word in ("--variant", v)]
    return run_sglang("--sglang-src", str(tree), *args, json_path=json_path)


def _renamed(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, f"{old} is not in the file any more"
        return text.replace(old, new)
    return edit


@pytest.mark.engine_run
def test_a_tree_lacking_a_feature_lists_its_variant_not_applicable(tmp_path):
    """FutureMap without its late-bound spec tails (as releases before 0.5.19): the EAGLE
    mixed-chunk variant is not applicable, named with the missing name; the other runs."""
    tree = _tree(tmp_path, _installed_package(), "srt/managers/overlap_utils.py",
                 _renamed("resolve_mixed_spec_tails", "resolve_mixed_tails_elsewhere"))
    status, output, document = _command(tree, "eagle_mixed", "idle_iteration",
                                        json_path=tmp_path / "loop.json")
    assert status == 0, output
    assert document["variants"] == ["idle_iteration"]
    [entry] = document["not_applicable"]
    assert entry["variant"] == "eagle_mixed"
    assert "overlap_utils:FutureMap has no resolve_mixed_spec_tails" in entry["reason"]
    assert "eagle_mixed: not applicable" in output


@pytest.mark.engine_run
def test_a_variant_that_cannot_be_driven_keeps_the_others_results(tmp_path):
    """Retraction calls what the driver did not plan: that variant is reported (exit 2, the
    line and function named), the one before it still ran and is in the JSON."""
    package = _installed_package()
    old = "old_available_tokens = self.token_to_kv_pool_allocator.available_size()"
    tree = _tree(tmp_path, package, "srt/managers/scheduler.py",
                 _renamed(old, "old_available_tokens = self.profiler_manager.start_profile()"))
    status, output, document = _command(tree, "retracted_request", "idle_iteration",
                                        json_path=tmp_path / "loop.json")
    assert status == 2, output
    scheduler = tree / "sglang/srt/managers/scheduler.py"
    line = next(i for i, text in enumerate(scheduler.read_text().splitlines(), 1)
                if "start_profile()" in text)
    assert output.strip().splitlines()[-1] == (
        "overlap-harness sglang: variant retracted_request cannot be driven on this tree: "
        "UnplannedUseError: profiler_manager.start_profile: not planned by the driver "
        f"(strict stub) at {scheduler.relative_to(tree)}:{line} in update_running_batch")
    assert "  idle_iteration: race-free" in output
    assert document["variants"] == ["idle_iteration"]
    assert document["races"] == []
    assert len(document["errors"]) == 1 and "retracted_request" in document["errors"][0]


def _older_release() -> Path:
    """The oldest supported release's package, fetched into the user's cache (skips with
    the reason when it cannot be fetched)."""
    from overlap_harness.engines.sglang import releases

    return _release(releases.SUPPORTED[0])


def _without_run_batch_entry_wait(text: str) -> str:
    """run_batch's first forward-stream wait on the schedule stream made ``pass`` (every
    line keeps its number)."""
    run_batch = next(node for node in ast.walk(ast.parse(text))
                     if isinstance(node, ast.FunctionDef) and node.name == "run_batch")
    lines = text.splitlines(keepends=True)
    index = next(i for i in range(run_batch.lineno - 1, run_batch.end_lineno or 0)
                 if lines[i].strip() == FORWARD_WAIT)
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    lines[index] = f"{indent}pass\n"
    return "".join(lines)


@pytest.mark.slow
@pytest.mark.engine_run
def test_an_older_release_without_the_forward_entry_wait_races_at_its_lines(tmp_path):
    package = _older_release()
    tree = _tree(tmp_path, package, "srt/managers/scheduler.py", _without_run_batch_entry_wait)
    status, output, document = _command(tree, "non_spec_decode",
                                        json_path=tmp_path / "loop.json")
    assert status == 1, output
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    assert any(s["file"].startswith(str(tree / "sglang") + os.sep) for s in sides), output


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_same_older_release_unmodified_is_race_free(tmp_path):
    package = _older_release()
    tree = _tree(tmp_path, package, "srt/managers/scheduler.py", lambda text: text)
    status, output, document = _command(tree, "non_spec_decode",
                                        json_path=tmp_path / "loop.json")
    assert status == 0, output
    assert document["variants"] == ["non_spec_decode"] and document["races"] == []


def _release(version: str) -> Path:
    """A supported release's package, fetched into the user's cache (skips with the reason
    when it cannot be fetched)."""
    from overlap_harness.engines.sglang import releases

    try:
        return releases.release_tree(version) / "sglang"
    except releases.ReleaseUnavailable as exc:
        pytest.skip(str(exc))


#: the release whose EAGLE v2 worker first waits for the forward stream before preparing the
#: draft extend on its plan stream (0.5.21 and before do not: their EAGLE variants race there)
EAGLE_WAIT_RELEASE = "0.5.22"


def _eagle_release() -> Path:
    return _release(EAGLE_WAIT_RELEASE)


DECODE_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"


def _read_done_after_the_replay(text: str) -> str:
    """0.5.17's ``execute`` with the read-done event recorded after the replay for every
    decode (as it already does for a breakable-graph verify), not before it; every line keeps
    its number."""
    text = _renamed("if publish_read_done and not read_done_post_replay:", "if False:")(text)
    return _renamed("if read_done_post_replay:", "if publish_read_done:")(text)


@pytest.mark.slow
@pytest.mark.engine_run
def test_0517s_read_done_event_before_the_replay_is_a_real_race(tmp_path):
    """SGLang 0.5.17 records the WAR barrier's read-done event before the decode graph's
    replay, while a backend's in-graph metadata prep reads req_to_token during the replay
    (docs/sglang-release-driving.md): graph_decode_radix races between the replay and the
    schedule stream's next write of the row, at 0.5.17's own lines."""
    package = _release("0.5.17")
    tree = _tree(tmp_path, package, DECODE_RUNNER, lambda text: text)
    status, output, document = _command(tree, "graph_decode_radix",
                                        json_path=tmp_path / "loop.json")
    assert status == 1, output
    assert document["races"], output
    for race in document["races"]:
        assert race["kind"] == "WAR" and "req_to_token" in race["tensor"], race
        assert "graph.replay" in race["first"]["op"], race
        assert race["second"]["stream"] == "self.schedule_stream", race
        assert race["second"]["file"] == str(tree / "sglang/srt/mem_cache/memory_pool.py")


@pytest.mark.slow
@pytest.mark.engine_run
def test_0517_with_the_read_done_event_after_the_replay_is_race_free(tmp_path):
    """The fixed twin: the same tree with the event recorded after the replay (what 0.5.18's
    SharedReadEnds gives a backend whose reads end in the replay, or later)."""
    package = _release("0.5.17")
    tree = _tree(tmp_path, package, DECODE_RUNNER, _read_done_after_the_replay)
    status, output, document = _command(tree, "graph_decode_radix",
                                        json_path=tmp_path / "loop.json")
    assert status == 0, output
    assert document["variants"] == ["graph_decode_radix"] and document["races"] == []


def _plan_stream_waits(tree: ast.AST) -> list[ast.If]:
    """``if self.plan_stream: self.plan_stream.wait_stream(...)`` statements: the plan stream
    waiting for another before work is queued on it."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "self.plan_stream"
                and len(node.body) == 1 and isinstance(node.body[0], ast.Expr)):
            continue
        if ast.unparse(node.body[0].value).startswith("self.plan_stream.wait_stream("):
            found.append(node)
    return found


def _without_draft_extend_plan_wait(text: str) -> str:
    """The plan stream's wait before the draft extend's preparation (the one the release's
    EAGLE worker has) made ``pass``, every line keeping its number."""
    [wait] = _plan_stream_waits(ast.parse(text))
    call = wait.body[0]
    lines = text.splitlines(keepends=True)
    indent = lines[call.lineno - 1][: len(lines[call.lineno - 1])
                                    - len(lines[call.lineno - 1].lstrip())]
    lines[call.lineno - 1] = f"{indent}pass\n"
    for index in range(call.lineno, call.end_lineno or call.lineno):
        lines[index] = "\n"
    return "".join(lines)


def _draft_extend_prep_lines(tree: Path) -> tuple[str, range]:
    """The lines of the release's ``prepare_for_draft_extend`` (what the worker queues on the
    plan stream before the draft extend), searched in the tree's own source."""
    common = tree / "sglang/srt/speculative/eagle_worker_common.py"
    prep = next(node for node in ast.walk(ast.parse(common.read_text()))
                if isinstance(node, ast.FunctionDef) and node.name == "prepare_for_draft_extend")
    return str(common), range(prep.lineno, (prep.end_lineno or prep.lineno) + 1)


def _plan_side_in_prep(races: list[dict], tree: Path) -> bool:
    """Some race has its plan-stream side inside the tree's draft-extend preparation."""
    common, lines = _draft_extend_prep_lines(tree)
    return any(side["stream"] == "plan_stream" and side["file"] == common
               and side["line"] in lines
               for r in races for side in (r["first"], r["second"]))


@pytest.mark.slow
@pytest.mark.engine_run
def test_an_older_release_without_the_eagle_plan_wait_races_at_its_lines(tmp_path):
    """0.5.22's EAGLE worker without its plan stream's wait for the forward stream before the
    draft extend's preparation (what 0.5.21 and before lack): exit 1, a race whose plan-stream
    side is inside that preparation, at that tree's lines."""
    tree = _tree(tmp_path, _eagle_release(), "srt/speculative/eagle_worker_v2.py",
                 _without_draft_extend_plan_wait)
    status, output, document = _command(tree, "eagle_topk4", json_path=tmp_path / "loop.json")
    assert status == 1, output
    races = document["races"]
    assert races and {r["variant"] for r in races} == {"eagle_topk4"}
    assert _plan_side_in_prep(races, tree), output


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_same_eagle_release_unmodified_is_race_free(tmp_path):
    tree = _tree(tmp_path, _eagle_release(), "srt/speculative/eagle_worker_v2.py",
                 lambda text: text)
    assert len(_plan_stream_waits(ast.parse(
        (tree / "sglang/srt/speculative/eagle_worker_v2.py").read_text()))) == 1
    status, output, document = _command(tree, "eagle_topk4", json_path=tmp_path / "loop.json")
    assert status == 0, output
    assert document["variants"] == ["eagle_topk4"] and document["races"] == []


#: the release just before EAGLE_WAIT_RELEASE: its worker prepares the draft extend on the
#: plan stream without waiting for the forward stream
EAGLE_NO_WAIT_RELEASE = "0.5.21"
PLAN_WAIT = ("if self.plan_stream: self.plan_stream.wait_stream("
             "torch.get_device_module(self.device).current_stream())")


def _with_draft_extend_plan_wait(text: str) -> str:
    """The plan stream made to wait for the worker's current (forward) stream before the
    draft extend's preparation is queued on it, written over the comment line above that
    ``with self.plan_stream_ctx:`` (every line keeps its number)."""
    lines = text.splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.strip() == "with self.plan_stream_ctx:"
                 and "prepare_for_draft_extend(" in lines[i + 1])
    assert lines[index - 1].strip().startswith("#"), lines[index - 1]
    indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
    lines[index - 1] = f"{indent}{PLAN_WAIT}\n"
    return "".join(lines)


def _no_wait_release() -> Path:
    return _release(EAGLE_NO_WAIT_RELEASE)


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_release_before_the_plan_wait_races_on_the_plan_stream(tmp_path):
    """0.5.21 as released (the EAGLE variants run with the plan stream on): exit 1, every race
    has a side on the plan stream, one inside the tree's draft-extend preparation."""
    tree = _tree(tmp_path, _no_wait_release(), "srt/speculative/eagle_worker_v2.py",
                 lambda text: text)
    assert _plan_stream_waits(ast.parse(
        (tree / "sglang/srt/speculative/eagle_worker_v2.py").read_text())) == []
    status, output, document = _command(tree, "eagle_topk4", json_path=tmp_path / "loop.json")
    assert status == 1, output
    races = document["races"]
    assert races and all("plan_stream" in (r["first"]["stream"], r["second"]["stream"])
                         for r in races), output
    assert _plan_side_in_prep(races, tree), output


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_release_before_the_plan_wait_with_it_added_is_race_free(tmp_path):
    """The fixed twin: the same tree with the plan stream waiting before the draft extend's
    preparation (the wait the next release has) runs race-free."""
    tree = _tree(tmp_path, _no_wait_release(), "srt/speculative/eagle_worker_v2.py",
                 _with_draft_extend_plan_wait)
    assert len(_plan_stream_waits(ast.parse(
        (tree / "sglang/srt/speculative/eagle_worker_v2.py").read_text()))) == 1
    status, output, document = _command(tree, "eagle_topk4", json_path=tmp_path / "loop.json")
    assert status == 0, output
    assert document["variants"] == ["eagle_topk4"] and document["races"] == []
