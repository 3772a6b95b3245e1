"""The pull-request view's output for a reviewer (engines/core/pr_view/output.py), from
documents written here by hand: one verdict line per change of at most 200 characters with
the variants summed up (count, first one); a move's removed half folded into the move's one
verdict; counts that say races and occurrences, the same on every line that gives them; each
race's sentence and its ``fix:`` hint; SARIF with one result per change and pair of racing
sites, both sites related, paths as the document gives them (relative to the tree root).
The end-to-end runs on SGLang twins are in test_pr_view_sglang.py."""

from __future__ import annotations

from pathlib import Path

from overlap_harness.engines.core.pr_view.compare import Coverage, change_views
from overlap_harness.engines.core.pr_view.output import sarif, text
from overlap_harness.engines.core.pr_view.trees import engine_tree, tree_hunks
from overlap_harness.engines.core.pr_view.view import verdict

VARIANTS = [f"variant_{i:02d}_with_a_long_descriptive_name" for i in range(30)]
WAIT = "self.forward_stream.wait_stream(self.schedule_stream_with_an_unusually_long_name_x)"


def _side(file: str, line: int, op: str, stream: str, **extra: object) -> dict:
    return {"file": file, "line": line, "function": "f", "code": "", "in_tree": True,
            "op": op, "stream": stream, "stack": [], **extra}


def _race(kind: str, tensor: str, first: dict, second: dict, count: int,
          variants: list[str], change_index: int = 0, what: str = f"removed `{WAIT}`",
          change: str = "pkg/sched.py:40") -> dict:
    return {"kind": kind, "tensor": tensor, "tensor_key": tensor, "first": first,
            "second": second, "count": count, "variants": variants, "change": change,
            "change_index": change_index, "attribution": "", "what": what}


def _document(races: list[dict], changes: list[dict]) -> dict:
    return {"variants": VARIANTS, "changes": changes, "races": races, "races_fixed": [],
            "unreached": [], "errors": {}, "not_applicable": {}}


REMOVAL = {"file": "pkg/sched.py", "lines": [40, 40], "reached_by": VARIANTS,
           "executable": True, "ordering": ["wait_stream"], "what": f"removed `{WAIT}`"}
WRITE = _side("pkg/alloc.py", 11, "_to_copy", "self.schedule_stream")
READ = _side("pkg/overlap.py", 62, "index_put_", "self.forward_stream")
STAND_IN = _side("overlap_harness/engines/x/worker.py", 158, "model_forward",
                 "self.forward_stream", in_tree=False,
                 stands_in_for={"file": "pkg/sched.py", "line": 70, "code": "forward()"})


def test_a_removal_with_races_in_every_variant_has_one_short_verdict_and_fix_hints() -> None:
    races = [_race("RAW", "indices@alloc.py:11", WRITE, READ, 181, VARIANTS[3:] + VARIANTS[:3]),
             _race("RAW", "indices@alloc.py:11", WRITE, STAND_IN, 50, VARIANTS[:2]),
             _race("reuse", "locs@alloc.py:9", WRITE, READ, 4, VARIANTS[5:6])]
    lines = text(_document(races, [REMOVAL]))
    verdicts = [line for line in lines if line.startswith("pkg/sched.py:40 ")]
    assert len(verdicts) == 1 and len(verdicts[0]) <= 200
    assert verdicts[0].endswith(": 3 new races (235 occurrences) in 30 variants, first "
                                "variant_00_with_a_long_descriptive_name")
    assert verdicts[0].startswith("pkg/sched.py:40 removed `self.forward_stream.wait_stream(")
    assert "..." in verdicts[0]  # the code shortened to fit, never the counts
    assert lines[1] == "new races of the change at pkg/sched.py:40: 3 new races (235 " \
        "occurrences)"
    assert lines[2:5] == [
        "  RAW on indices, 181 occurrences in 30 variants, first "
        "variant_03_with_a_long_descriptive_name:",
        "    index_put_ on self.forward_stream (pkg/overlap.py:62) reads indices and can run "
        "before _to_copy on self.schedule_stream (pkg/alloc.py:11) has finished writing it.",
        f"    fix: restore the removed `{WAIT}`"]
    assert lines[6] == ("    model_forward on self.forward_stream (pkg/sched.py:70, the "
                        "harness's stand-in) reads indices and can run before _to_copy on "
                        "self.schedule_stream (pkg/alloc.py:11) has finished writing it.")
    assert lines[9] == ("    index_put_ on self.forward_stream (pkg/overlap.py:62) uses memory "
                        "of locs handed out again, and can run while _to_copy on "
                        "self.schedule_stream (pkg/alloc.py:11) may still use it.")
    status, reason = verdict(_document(races, [REMOVAL]), allow_unreached=False)
    assert (status, reason) == (1, "3 new races (235 occurrences)")


def test_an_added_line_gets_the_event_hint_and_a_host_read_a_synchronize() -> None:
    added = dict(REMOVAL, what="edited lines 40-44")
    host_read = _side("pkg/out.py", 5, "tolist", "host")
    races = [_race("WAR", "buf@a.py:1", READ, WRITE, 1, VARIANTS[:1], what="edited lines 40-44"),
             _race("RAW", "out@a.py:2", WRITE, host_read, 2, VARIANTS[:1],
                   what="edited lines 40-44")]
    lines = text(_document(races, [added]))
    assert lines[0] == ("pkg/sched.py:40 edited lines 40-44: 2 new races (3 occurrences) in "
                        "variant_00_with_a_long_descriptive_name")
    assert ("    fix: record an event on self.forward_stream after index_put_ "
            "(pkg/overlap.py:62) and make self.schedule_stream wait on it before _to_copy "
            "(pkg/alloc.py:11)") in lines
    assert ("    fix: record an event on self.schedule_stream after _to_copy (pkg/alloc.py:11) "
            "and synchronize on it before tolist (pkg/out.py:5)") in lines


def test_only_ten_races_a_change_are_listed_and_the_header_says_so() -> None:
    races = [_race("RAW", f"t{i}@a.py:1", WRITE, _side("pkg/b.py", i, "add", "s2"), 1,
                   VARIANTS[:1]) for i in range(1, 13)]
    lines = text(_document(races, [REMOVAL]))
    assert lines[1] == ("new races of the change at pkg/sched.py:40: 12 new races (12 "
                        "occurrences); below the 10 seen in most variants, every one in "
                        "--json and --sarif")
    assert sum(line.startswith("    fix: ") for line in lines) == 10


def test_sarif_has_one_result_per_change_and_pair_of_racing_sites() -> None:
    """Two races of one pair of sites (two buffers) are one result; a side in the harness's
    stand-in code is related at the tree's line that called it."""
    races = [_race("RAW", "a@alloc.py:11", WRITE, READ, 3, VARIANTS[:2]),
             _race("RAW", "b@alloc.py:12", WRITE, READ, 1, VARIANTS[1:3]),
             _race("RAW", "a@alloc.py:11", WRITE, STAND_IN, 2, VARIANTS[:1])]
    results = sarif(_document(races, [REMOVAL]))["runs"][0]["results"]
    assert len(results) == 2

    def where(location: dict) -> tuple[str, int]:
        physical = location["physicalLocation"]
        return physical["artifactLocation"]["uri"], physical["region"]["startLine"]
    assert [[where(loc) for loc in r["locations"]] for r in results] == [
        [("pkg/sched.py", 40)], [("pkg/sched.py", 40)]]
    assert [[where(loc) for loc in r["relatedLocations"]] for r in results] == [
        [("pkg/alloc.py", 11), ("pkg/overlap.py", 62)],
        [("pkg/alloc.py", 11), ("pkg/sched.py", 70)]]
    message = results[0]["message"]["text"]
    assert message.startswith(f"removed `{WAIT}`: 2 new races (4 occurrences) in 3 variants, "
                              "first variant_00_with_a_long_descriptive_name on a, b. ")
    assert message.endswith(f" fix: restore the removed `{WAIT}`")


MODULE = '''import torch


def step(stream, buf, ev, host):
    ev.record()
    host.copy_(buf, non_blocking=True)
    total = 0
    return host
'''


def _tree(root: Path, text_: str) -> Path:
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "loop.py").write_text(text_)
    return root


def test_a_move_is_one_verdict(tmp_path: Path) -> None:
    """An event record moved below the copy it should follow: two hunks (the removal and the
    addition), one verdict line, at the line it moved to."""
    moved = MODULE.replace("    ev.record()\n", "").replace(
        "    total = 0\n", "    total = 0\n    ev.record()\n")
    base = engine_tree("sglang", _tree(tmp_path / "base", MODULE))
    head = engine_tree("sglang", _tree(tmp_path / "head", moved))
    views = change_views(tree_hunks(head, base), Coverage(head, {}), Coverage(base, {}))
    changes = [dict(v.to_json(), what=v.what()) for v in views]
    assert len(changes) == 2 and [c.get("part_of_move") for c in changes] == [True, None]
    for change in changes:
        change["reached_by"] = ["v"]
    lines = text(_document([], changes))
    assert lines == ["sglang/loop.py:7 moved `ev.record()` (from line 5): no new race (run in v)"]
