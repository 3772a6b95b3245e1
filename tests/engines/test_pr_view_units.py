"""The pull-request view's parts that need no engine run: changed hunks from two trees (and
from a git revision), the ordering lines of a file, race matching by code, the attribution of
a race to a change, the exit verdict, and the CI workflow's command against the real parser.
The twins that run SGLang and vLLM are in test_pr_view_sglang.py / test_pr_view_vllm.py."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from overlap_harness.cli import build_parser
from overlap_harness.engines.core.pr_view.compare import (
    Attributor,
    ChangeView,
    race_key,
)
from overlap_harness.engines.core.pr_view.ordering import ordering_lines, statement_starts
from overlap_harness.engines.core.pr_view.trees import (
    engine_tree,
    materialise_base,
    scratch_folder,
    tree_hunks,
)
from overlap_harness.engines.core.pr_view.view import verdict

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "docs" / "examples" / "overlap-harness-pr.yml"

MODULE = '''import torch


def step(stream, other, buf, ev):
    """Docstring."""
    stream.wait_stream(other)
    with torch.cuda.stream(stream):
        buf.add_(1)
    ev.record()
    host = torch.empty(4, pin_memory=True)
    host.copy_(buf,
               non_blocking=True)
    ev.synchronize()
    return host
'''


def _tree(root: Path, text: str) -> Path:
    (root / "sglang" / "srt").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "loop.py").write_text(text)
    return root


def _lines_of(text: str, code: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.strip() == code)


def test_ordering_lines_cover_the_scan_and_its_extensions(tmp_path: Path) -> None:
    path = _tree(tmp_path, MODULE) / "sglang" / "srt" / "loop.py"
    lines = ordering_lines(path)
    assert lines[_lines_of(MODULE, "stream.wait_stream(other)")] == "wait_stream"
    assert lines[_lines_of(MODULE, "with torch.cuda.stream(stream):")] == "stream_switch"
    assert lines[_lines_of(MODULE, "host = torch.empty(4, pin_memory=True)")] == \
        "pinned_allocation"
    copy = _lines_of(MODULE, "host.copy_(buf,")
    assert lines[copy] == lines[copy + 1] == "non_blocking_copy"  # both lines it spans
    assert _lines_of(MODULE, "buf.add_(1)") not in lines
    starts = statement_starts(path)
    assert starts[copy + 1] == copy  # coverage names a statement by its first line


def test_a_removed_sync_is_anchored_at_the_next_statement(tmp_path: Path) -> None:
    base = engine_tree("sglang", _tree(tmp_path / "base", MODULE))
    edited = MODULE.replace("    ev.record()\n", "")
    head = engine_tree("sglang", _tree(tmp_path / "head", edited))
    [hunk] = tree_hunks(head, base)
    assert hunk.file == "sglang/srt/loop.py" and hunk.removal
    assert hunk.head_first == _lines_of(edited, "host = torch.empty(4, pin_memory=True)")
    assert list(hunk.base_ordering.values()) == ["event.record"]
    assert hunk.removed_code == ["ev.record()"]


def test_a_moved_record_is_paired_with_its_new_line(tmp_path: Path) -> None:
    base = engine_tree("sglang", _tree(tmp_path / "base", MODULE))
    edited = MODULE.replace("    ev.record()\n", "").replace(
        "    stream.wait_stream(other)\n", "    ev.record()\n    stream.wait_stream(other)\n")
    head = engine_tree("sglang", _tree(tmp_path / "head", edited))
    hunks = tree_hunks(head, base)
    added = [h for h in hunks if h.head_ordering]
    assert [h.moved_from for h in added] == [_lines_of(MODULE, "ev.record()")]
    view = ChangeView(added[0], [], True)
    assert view.location == f"sglang/srt/loop.py:{_lines_of(edited, 'ev.record()')}"
    assert view.what().startswith("moved `ev.record()`")


def test_a_git_revision_is_written_out_as_the_base(tmp_path: Path) -> None:
    checkout = _tree(tmp_path / "repo", MODULE)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    edited = MODULE.replace("    ev.synchronize()\n", "")
    (checkout / "sglang" / "srt" / "loop.py").write_text(edited)
    scratch = scratch_folder()
    head = engine_tree("sglang", checkout)
    base = materialise_base("sglang", head, "HEAD", scratch)
    [hunk] = tree_hunks(head, base)
    assert hunk.removed_code == ["ev.synchronize()"] and base.root != head.root


def _side(file: str, line: int, function: str, code: str, stack: list[tuple[str, int]]) -> dict:
    return {"file": file, "line": line, "function": function, "code": code, "op": "add_",
            "stream": "s", "in_tree": True,
            "stack": [{"file": f, "line": n, "function": "", "code": ""} for f, n in stack]}


def test_races_match_by_code_not_by_line() -> None:
    one = {"kind": "RAW", "tensor_key": "buf@x", "first": _side("a.py", 10, "f", "w()", []),
           "second": _side("a.py", 20, "f", "r()", [])}
    shifted = {**one, "first": _side("a.py", 13, "f", "w()", []),
               "second": _side("a.py", 23, "f", "r()", [])}
    other = {**one, "second": _side("a.py", 20, "f", "r2()", [])}
    assert race_key(one) == race_key(shifted) != race_key(other)


def test_a_race_is_attributed_to_the_nearest_changed_sync_on_its_stacks(tmp_path: Path) -> None:
    base = engine_tree("sglang", _tree(tmp_path / "base", MODULE))
    edited = MODULE.replace("    stream.wait_stream(other)\n", "").replace(
        '    """Docstring."""\n', '    """Docstring, edited."""\n')
    head = engine_tree("sglang", _tree(tmp_path / "head", edited))
    views = [ChangeView(h, [], True) for h in tree_hunks(head, base)]
    file, add = "sglang/srt/loop.py", _lines_of(edited, "buf.add_(1)")
    race = {"first": _side(file, add, "step", "buf.add_(1)", [(file, add)]),
            "second": _side("elsewhere.py", 3, "g", "", [])}
    view, how = Attributor(views, head).attribute(race)
    assert view is not None and view.what() == "removed `stream.wait_stream(other)`"
    assert "ordering" in how


@pytest.mark.parametrize(("document", "allow", "status"), [
    ({"races": [{}], "errors": {}, "unreached": [{"file": "a", "line": 1, "code": "x"}],
      "changes": []}, False, 1),
    ({"races": [], "errors": {}, "unreached": [{"file": "a", "line": 1, "code": "x"}],
      "changes": []}, False, 2),
    ({"races": [], "errors": {}, "unreached": [{"file": "a", "line": 1, "code": "x"}],
      "changes": []}, True, 0),
    ({"races": [], "errors": {}, "unreached": [],
      "changes": [{"file": "a", "lines": [1, 1], "executable": True, "reached_by": []}]},
     False, 2),
    ({"races": [], "errors": {}, "unreached": [],
      "changes": [{"file": "a", "lines": [1, 1], "executable": True, "reached_by": ["v"]}]},
     False, 0),
])
def test_the_exit_status(document: dict, allow: bool, status: int) -> None:
    assert verdict(document, allow)[0] == status


def test_the_workflow_runs_a_command_the_parser_takes() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["overlap"]["steps"]
    [run] = [s["run"] for s in steps if "overlap-harness sglang" in s.get("run", "")]
    command = shlex.split(run)
    args = build_parser().parse_args(command[1:])
    assert args.base == "$BASE" and args.sglang_src == "sglang" and args.sarif is not None
    uploads = [s for s in steps if s.get("uses", "").startswith(
        "github/codeql-action/upload-sarif")]
    assert [u["with"]["sarif_file"] for u in uploads] == [str(args.sarif)]


def test_necessity_changes_are_matched_by_function_and_code() -> None:
    from overlap_harness.engines.core.pr_view.view import _necessity_changed

    def row(root: str, line: int, code: str, verdict: str) -> dict:
        return {"site": f"{root}/sglang/a.py:{line}", "function": "F.step", "code": code,
                "variant": "v", "verdict": verdict}
    head = {"necessity": [row("/h", 12, "s.wait_stream(o)", "redundant"),
                          row("/h", 20, "ev.record()", "necessary")]}
    base = {"necessity": [row("/b", 10, "s.wait_stream(o)", "necessary"),
                          row("/b", 18, "ev.record()", "necessary")]}
    changed = _necessity_changed(head, base, "/h", "/b")
    assert [(c["file"], c["line"], c["base"], c["head"]) for c in changed] == [
        ("sglang/a.py", 12, "necessary", "redundant")]
