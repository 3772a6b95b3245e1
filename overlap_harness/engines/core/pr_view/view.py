"""``overlap-harness sglang|vllm --ENGINE-src HEAD --base BASE``: run both trees, report the
difference (docs/pull-requests.md).

Each tree is imported in its own child process (:mod:`.child`; an engine's modules are loaded
into ``sys.modules`` once per process); with ``-j 2`` or more the two run at once. Exit 1 on a
new race; else 2 when a variant of HEAD cannot be driven, when a changed ordering line was run
by no variant, or when changed statements exist and no variant ran any (``--allow-unreached``
accepts the last two); else 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.pr_view import output
from overlap_harness.engines.core.pr_view.compare import (
    Attributor,
    Coverage,
    change_views,
    group_races,
    move_target,
    unreached_lines,
)
from overlap_harness.engines.core.pr_view.trees import (
    Tree,
    TreeError,
    engine_tree,
    materialise_base,
    scratch_folder,
    tree_hunks,
)


def _child_command(engine: str, tree: Tree, result: Path, args: Any,
                   cover: list[str]) -> list[str]:
    command = [sys.executable, "-m", "overlap_harness.engines.core.pr_view.child", engine,
               str(tree.root), str(result), "-j", str(args.jobs)]
    for name in args.variant or []:
        command += ["--variant", name]
    for file in cover:
        command += ["--cover", file]
    return command + (["--necessity"] if args.necessity else [])


def _run_children(commands: list[list[str]], logs: list[Path], parallel: bool) -> list[int]:
    """Run the children (at once when ``parallel``), each one's output into its log; their
    exit statuses, None for a child never started or stopped. A child that fails stops the
    others (the view needs both trees), and so does Ctrl-C: each child is ended within a
    second or two, never left running after the command."""
    codes: list[int | None] = [None] * len(commands)
    running: dict[int, subprocess.Popen] = {}
    waiting = list(range(len(commands)))
    try:
        while waiting or running:
            while waiting and (parallel or not running):
                index = waiting.pop(0)
                with logs[index].open("w") as out:
                    # a session of its own: stopping it stops its forked necessity
                    # children too (its process group), and Ctrl-C is this process's to handle
                    running[index] = subprocess.Popen(commands[index], stdout=out,
                                                      stderr=subprocess.STDOUT,
                                                      start_new_session=True)
            time.sleep(0.1)
            finished = [i for i, process in running.items() if process.poll() is not None]
            for index in finished:
                codes[index] = running.pop(index).returncode
            if any(codes[i] != 0 for i in finished):  # the view cannot be made: stop the rest
                waiting.clear()
                _stop(running.values())
                running.clear()
    except BaseException:
        _stop(running.values())
        raise
    return codes


def _stop(processes: Any) -> None:
    """End ``processes`` and their process groups (each child's forked children):
    SIGTERM, then SIGKILL for any still running after two seconds."""
    processes = list(processes)
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.perf_counter() + 2.0
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()
        _signal_group(process, signal.SIGKILL)  # forked children left behind, if any


def _signal_group(process: subprocess.Popen, number: int) -> None:
    """Send ``number`` to the process group ``process`` leads (gone already: nothing)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, number)


def _progress(log: Path) -> list[str]:
    return [line.rstrip() for line in log.read_text(errors="replace").splitlines()
            if line.startswith("  [")]


def _child_failure(name: str, code: int, result: Path, log: Path) -> str:
    """Why one tree's run gave no result: the child's one line when the tree does not import
    (``FILE:LINE: ERROR``, relative to that tree's root), else the last line of its log."""
    if result.is_file():
        fatal = json.loads(result.read_text()).get("fatal")
        if fatal:
            return f"the {name} tree cannot be driven: {fatal}"
    tail = log.read_text(errors="replace").strip().splitlines()[-1:]
    return f"the {name} tree's run failed (exit {code}): {' '.join(tail)}"


def _necessity_changed(head: dict[str, Any], base: dict[str, Any], head_root: str,
                       base_root: str) -> list[dict[str, Any]]:
    """Sites (matched by file, function and code) whose verdict differs between the trees."""
    def rows(side: dict[str, Any], root: str) -> dict[tuple, dict[str, Any]]:
        out = {}
        for row in side.get("necessity", []):
            file, _, line = row["site"].rpartition(":")
            relative = os.path.relpath(file, root)
            out[(relative, row["function"], row["code"], row["variant"])] = dict(
                row, file=relative, line=int(line))
        return out
    ours, theirs = rows(head, head_root), rows(base, base_root)
    changed = []
    for key in sorted(set(ours) | set(theirs)):
        now, before = ours.get(key), theirs.get(key)
        verdict_now = now["verdict"] if now else "absent"
        verdict_before = before["verdict"] if before else "absent"
        if verdict_now != verdict_before:
            shown = now or before
            changed.append({"file": key[0], "line": shown["line"], "function": key[1],
                            "code": key[2], "variant": key[3], "base": verdict_before,
                            "head": verdict_now})
    return changed


def compare(engine: str, head: Tree, base: Tree, hunks: list, ours: dict[str, Any],
            theirs: dict[str, Any]) -> dict[str, Any]:
    """The document of the difference between the two children's results."""
    head_cov, base_cov = Coverage(head, ours["covered"]), Coverage(base, theirs["covered"])
    views = change_views(hunks, head_cov, base_cov)
    both = set(ours["variants"]) - set(ours["errors"]) - set(theirs["errors"]) \
        - set(ours["not_applicable"]) - set(theirs["not_applicable"])
    new_groups = group_races(ours["races"], both)
    old_groups = group_races(theirs["races"], both)
    attributor = Attributor(views, head)
    races = []
    for key, group in new_groups.items():
        if key in old_groups:
            continue
        view, how = attributor.attribute(group.example)
        if view is not None:
            view = move_target(view, views)
        race = dict(group.example, variants=group.variants, count=group.count,
                    change=view.location if view else "", attribution=how,
                    change_index=views.index(view) if view else -1,
                    what=view.what() if view else "")
        race.pop("variant"), race.pop("iteration")
        race.update(explanation=output.explanation(race), fix=output.fix_hint(race))
        races.append(race)
    fixed = []
    for key, group in old_groups.items():
        if key not in new_groups:
            race = dict(group.example, variants=group.variants, count=group.count)
            race.pop("variant"), race.pop("iteration")
            fixed.append(race)
    text_of = {}
    for tree, store in ((head, "head"), (base, "base")):
        text_of[store] = {v.hunk.file: (tree.file(v.hunk.file).read_text().splitlines()
                                        if tree.file(v.hunk.file).is_file() else [])
                          for v in views}
    document: dict[str, Any] = {
        "engine": engine, "head": {"source": str(head.root), "version": ours["version"]},
        "base": {"source": str(base.root), "version": theirs["version"]},
        "variants": ours["variants"],
        "changes": [dict(v.to_json(), what=v.what()) for v in views],
        "races": races, "races_fixed": fixed,
        "unreached": unreached_lines(views, head_cov, base_cov, text_of["head"],
                                     text_of["base"]),
        "errors": ours["errors"], "base_errors": theirs["errors"],
        "not_applicable": ours["not_applicable"],
        "base_not_applicable": theirs["not_applicable"]}
    if "necessity" in ours:
        document["necessity_changed"] = _necessity_changed(ours, theirs, ours["root"],
                                                           theirs["root"])
    return document


def verdict(document: dict[str, Any], allow_unreached: bool) -> tuple[int, str]:
    """The exit status and its one-line reason (see the module docstring)."""
    if document["races"]:
        return 1, output.count_phrase(document["races"])
    if document["errors"]:
        return 2, "variants of HEAD cannot be driven: " + ", ".join(document["errors"])
    if document["unreached"] and not allow_unreached:
        return 2, ("changed stream-ordering lines no variant ran (the verdict is incomplete; "
                   "--allow-unreached accepts it): " + "; ".join(
                       f"{u['file']}:{u['line']} `{u['code']}`" for u in document["unreached"]))
    changed = [c for c in document["changes"] if c["executable"]]
    if changed and not any(c["reached_by"] for c in changed) and not allow_unreached:
        return 2, ("no variant ran any changed statement (nothing of this change was checked; "
                   "--allow-unreached accepts it): " + ", ".join(
                       f"{c['file']}:{c['lines'][0]}" for c in changed))
    return 0, "no new race; every changed ordering line ran"


def run(args: Any, engine: str, prog: str) -> int:
    """The pull-request view of ``args`` (the engine command's parsed options)."""
    from overlap_harness.engines.core.command import fail, interrupted, write_document

    source = getattr(args, f"{engine}_src")
    if source is None:
        return fail(prog, f"--base needs --{engine}-src HEAD (the changed tree)")
    started, cpu = time.perf_counter(), time.process_time()
    children_before = os.times()
    scratch = scratch_folder()
    try:
        try:
            head = engine_tree(engine, source)
            base = materialise_base(engine, head, args.base, scratch)
        except TreeError as exc:
            return fail(prog, str(exc))
        hunks = tree_hunks(head, base)
        cover = sorted({h.file for h in hunks})
        print(f"{prog}: {len(hunks)} changed hunks in {len(cover)} files; running HEAD "
              f"{head.root} and BASE {base.root}", flush=True)
        results = [scratch / "head.json", scratch / "base.json"]
        logs = [scratch / "head.log", scratch / "base.log"]
        try:
            codes = _run_children([_child_command(engine, t, r, args, cover)
                                   for t, r in zip((head, base), results, strict=True)],
                                  logs, parallel=args.jobs >= 2)
        except KeyboardInterrupt:  # both trees' runs stopped: nothing to compare yet
            return interrupted(prog, {"engine": engine, "head": {"source": str(head.root)},
                                      "base": {"source": str(base.root)}, "races": []},
                               [args.json] if args.json else [])
        for name, code, result, log in zip(("HEAD", "BASE"), codes, results, logs,
                                           strict=True):
            if code is None:  # stopped: the other tree's run failed
                continue
            print("\n".join(_progress(log)))
            if code != 0 or not result.is_file():
                message = _child_failure(name, code, result, log)
                fatal = {"engine": engine, "head": {"source": str(head.root)},
                         "base": {"source": str(base.root)}, "races": [],
                         "fatal": message, "exit": {"status": 2, "reason": message}}
                write_document(fatal, [args.json] if args.json else [])
                return fail(prog, message)
        ours, theirs = (json.loads(r.read_text()) for r in results)
        document = compare(engine, head, base, hunks, ours, theirs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    status, reason = verdict(document, args.allow_unreached)
    children = os.times()
    document["cost"] = {
        "wall_s": round(time.perf_counter() - started, 2),
        "cpu_s_parent": round(time.process_time() - cpu, 2),
        "cpu_s_children": round(children.children_user + children.children_system
                                - children_before.children_user
                                - children_before.children_system, 2)}
    document["exit"] = {"status": status, "reason": reason}
    for line in output.text(document):
        print(line)
    print(f"{prog}: {reason}", file=sys.stderr if status else sys.stdout)
    cost = document["cost"]
    print(f"cost: {cost['cpu_s_parent'] + cost['cpu_s_children']:.1f} CPU s "
          f"({cost['cpu_s_children']:.1f} in the two trees' runs), {cost['wall_s']:.1f} s wall")
    write_document(document, [args.json] if args.json else [])
    if args.sarif:
        output.write_sarif(document, args.sarif)
        print(f"wrote {args.sarif}")
    return status
