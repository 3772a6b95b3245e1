"""Which of vLLM's syncs are necessary: every sync statement of the driven functions, found in
the source (AST), removed in turn from vLLM's own function, each variant that reaches it run
under the recorder.

Engine-neutral in its parts (:func:`sync_sites`, :func:`lines_reached`, :func:`row`): the
shared core's scan and table, written beside the vLLM adapter until the two cores merge; the
list of functions and variants (:data:`TARGETS`) is vLLM's. A row's verdict: ``race`` (the
sync is necessary there: the races and both lines), ``race_free`` (redundant there), or
``not_reached`` (the variant never ran that line: a coverage gap, not a verdict).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from overlap_harness.engines.vllm.mutation import Site, removed

SYNC_CALLS = frozenset({"wait_stream", "wait_event", "record", "synchronize", "query",
                        "record_stream", "wait"})


def sync_sites(owner: Any, attribute: str) -> list[Site]:
    """Every simple statement of ``owner.attribute`` that calls a stream/event sync
    (``wait_stream``, ``record``, ``synchronize``...), with its file and line."""
    function = inspect.unwrap(inspect.getattr_static(owner, attribute))
    lines, start = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    file = inspect.getsourcefile(function) or ""
    sites = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Expr | ast.Assign | ast.AnnAssign | ast.AugAssign):
            continue
        calls = [c for c in ast.walk(node) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and c.func.attr in SYNC_CALLS]
        if calls:
            line = start + node.lineno - 1
            sites.append(Site(owner, attribute, file, line, lines[node.lineno - 1].strip()))
    return sorted(sites, key=lambda s: s.line)


def lines_reached(run: Callable[[], Any], files: Iterable[str]) -> tuple[Any, set[tuple]]:
    """Run ``run()`` with the lines it executes in ``files`` recorded: (its result, the set
    of ``(file, line)``)."""
    wanted = {str(Path(f).resolve()) for f in files}
    reached: set[tuple[str, int]] = set()
    resolved: dict[str, str] = {}

    def local(frame: Any, event: str, _arg: Any) -> Any:
        if event == "line":
            reached.add((frame.f_code.co_filename, frame.f_lineno))
        return local

    def tracer(frame: Any, event: str, _arg: Any) -> Any:
        name = frame.f_code.co_filename
        full = resolved.get(name)
        if full is None:
            full = resolved[name] = str(Path(name).resolve()) if name[:1] != "<" else name
        return local if full in wanted else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = run()
    finally:
        sys.settrace(previous)
    return result, {(str(Path(f).resolve()), line) for f, line in reached}


def _race_record(race: Any) -> dict[str, str]:
    return {"kind": str(race.kind), "tensor": race.buffer,
            "first": race.first.source, "second": race.second.source}


def row(variant: str, site: Site, run: Callable[[], Any], reached: set[tuple]) -> dict:
    """One row of the table: ``site`` removed, ``variant`` run (unless it never reaches it)."""
    base = {"variant": variant, "site": f"{site.file}:{site.line}", "code": site.code}
    if (str(Path(site.file).resolve()), site.line) not in reached:
        return {**base, "real": "not_reached", "races": 0, "pairs": []}
    with removed(site):
        watcher = run()
    pairs = sorted({(r["kind"], r["first"], r["second"])
                    for r in map(_race_record, watcher.races)})
    return {**base, "real": "race" if watcher.races else "race_free",
            "races": len(watcher.races),
            "pairs": [{"kind": k, "first": a, "second": b} for k, a, b in pairs]}


def targets() -> list[tuple[Any, str, list[str]]]:
    """vLLM's driven functions with sync statements, and the variants that run them."""
    from vllm.v1.worker.gpu.async_utils import AsyncOutput, AsyncPoolingOutput
    from vllm.v1.worker.gpu_model_runner import (
        AsyncGPUModelRunnerOutput,
        AsyncGPUPoolingModelRunnerOutput,
        GPUModelRunner,
    )

    return [
        (AsyncGPUModelRunnerOutput, "__init__", ["v1-async-output"]),
        (AsyncGPUModelRunnerOutput, "get_output", ["v1-async-output"]),
        (GPUModelRunner, "synchronize_input_prep", ["v1-input-prep"]),
        (GPUModelRunner, "_copy_valid_sampled_token_count", ["v1-spec-decode"]),
        (GPUModelRunner, "_get_valid_sampled_token_count", ["v1-spec-decode"]),
        (GPUModelRunner, "_copy_draft_token_ids_to_cpu", ["v1-spec-decode"]),
        (GPUModelRunner, "_get_draft_token_ids_cpu", ["v1-spec-decode"]),
        (AsyncGPUPoolingModelRunnerOutput, "__init__", ["v1-pooling"]),
        (AsyncGPUPoolingModelRunnerOutput, "get_output", ["v1-pooling"]),
        (AsyncOutput, "__init__", ["mrv2-uva-ring", "engine-core"]),
        (AsyncOutput, "get_output", ["mrv2-uva-ring", "engine-core"]),
        (AsyncPoolingOutput, "__init__", ["mrv2-pooling"]),
        (AsyncPoolingOutput, "get_output", ["mrv2-pooling"]),
    ]


def necessity_table(variants: dict[str, Callable[[], Any]]) -> list[dict]:
    """Every sync statement of :func:`targets` removed in turn, per variant."""
    plan = [(site, names) for owner, attribute, names in targets()
            for site in sync_sites(owner, attribute)]
    files = {site.file for site, _names in plan}
    reached_by: dict[str, set[tuple]] = {}
    rows = []
    for site, names in plan:
        for name in names:
            if name not in reached_by:
                watcher, reached_by[name] = lines_reached(variants[name], files)
                if watcher.races:
                    raise RuntimeError(f"{name}: races as released; no table on a racy base")
            rows.append(row(name, site, variants[name], reached_by[name]))
    return rows
