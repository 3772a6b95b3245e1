"""One tree's side of a pull request's view, run in its own process.

``python -m overlap_harness.engines.core.pr_view.child ENGINE SRC RESULT.json [--variant V]...
[--cover FILE]... [--necessity] [-j N]`` imports the engine from SRC (each tree needs its own
``sys.modules``), runs the variants under the recorder with coverage.py measuring the lines
of the ``--cover`` files (relative to the tree root; only those, to keep the cost low) per
variant (a coverage context each), keeps every op's stack (:mod:`.stacks`), and writes the
races with both sides' stacks, the covered lines and, with ``--necessity``, the necessity
table. A variant that cannot be driven is kept as its error; the others still run. A tree
that does not import writes ``{"fatal": "FILE:LINE: ERROR"}`` instead and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import linecache
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.pr_view.ordering import enclosing_functions
from overlap_harness.engines.core.pr_view.stacks import Frame, StackKeeper
from overlap_harness.engines.core.pr_view.trees import engine_tree
from overlap_harness.model.errors import HarnessError


@dataclass
class EngineSide:
    """What the child needs of an engine: its version, its variants, one variant's run
    (returning the recorder's races and ``Watch``) and its necessity table."""

    version: str
    variants: list[str]
    run: Callable[[str], tuple[list[Any], Any]]
    necessity: Callable[[Sequence[str], dict[str, Any], int], list[Any]]
    run_outcome: Callable[[str], Any]
    not_applicable: Callable[[str], str | None] = lambda name: None  # why it cannot apply


def engine_side(engine: str, source: str) -> EngineSide:
    """The engine imported from ``source`` as the child needs it: the adapter's
    ``overlap_harness.engines.ENGINE.pr_side.side`` (found by name: the core imports no
    adapter)."""
    module = importlib.import_module(f"overlap_harness.engines.{engine}.pr_side")
    return module.side(source)


_HARNESS_ROOT = str(Path(__file__).resolve().parents[4]) + os.sep  # holds overlap_harness/


class _Describer:
    """Race sides as JSON: files relative to the tree root, each line's function and code."""

    def __init__(self, root: Path, keeper: StackKeeper) -> None:
        self.root = root
        self.keeper = keeper
        self._functions: dict[str, list[tuple[int, int, str]]] = {}

    def where(self, filename: str, line: int | None) -> dict[str, Any]:
        """``{file, line, function, code}`` of one line (file relative when in the tree)."""
        path = os.path.abspath(filename)
        functions = self._functions.get(path)
        if functions is None:
            functions = self._functions[path] = enclosing_functions(path)
        inner = [name for first, last, name in functions
                 if line is not None and first <= line <= last]
        code = linecache.getline(path, line).strip() if line else ""
        if self.keeper.is_tree_file(path):
            shown = os.path.relpath(path, self.root)
        elif path.startswith(_HARNESS_ROOT):  # a stand-in: named in the harness's checkout
            shown = os.path.relpath(path, _HARNESS_ROOT)
        else:
            shown = path
        return {"file": shown, "line": line, "function": inner[-1] if inner else "",
                "code": code, "in_tree": self.keeper.is_tree_file(path)}

    def side(self, access: Any, recording: Any) -> dict[str, Any]:
        """One side of a race: where, op, stream, the tree's frames and, for a side in the
        harness's stand-in code, the nearest tree frame that called into it."""
        from overlap_harness.recorder.sites import split_site

        file, line = split_site(access.source)
        side = self.where(file, line) if file else {"file": "", "line": None, "function": "",
                                                     "code": "", "in_tree": False}
        frames: tuple[Frame, ...] = self.keeper.of(recording, access.op)
        stack = [self.where(f, n) for f, n, _name in frames if self.keeper.is_tree_file(f)]
        side.update(op=access.op_name, stream=access.agent, stack=stack)
        if not side["in_tree"]:
            side["stands_in_for"] = stack[0] if stack else None
        return side


def _tensor_key(buffer: str, buffer_sites: dict[str, str], describer: _Describer) -> str:
    """The buffer's name with its allocation line's code instead of its line number (a race
    is matched across trees by code, and an edit above the allocation shifts the number)."""
    name, at, _where = buffer.partition("@")
    site = buffer_sites.get(buffer, "")
    file, _, line = site.rpartition(":")
    if at and file and line.isdigit():
        allocation = describer.where(file, int(line))
        return f"{name}@{allocation['file']}:{allocation['function']}:{allocation['code']}"
    return name


def _races(name: str, races: list[Any], watch: Any, describer: _Describer) -> list[dict]:
    recording = getattr(watch, "recording", None)
    sites = dict(getattr(watch, "buffer_sites", {}) or {})
    out = []
    for race in races:
        out.append({"kind": str(race.kind), "tensor": race.buffer,
                    "tensor_key": _tensor_key(race.buffer, sites, describer),
                    "variant": name, "iteration": race.second.iteration,
                    "first": describer.side(race.first, recording),
                    "second": describer.side(race.second, recording)})
    return out


def run_side(engine: str, source: str, variants: Sequence[str], cover: Sequence[str],
             necessity: bool, jobs: int) -> dict[str, Any]:
    """Run one tree's variants (see the module docstring); the result as JSON data."""
    import coverage

    from overlap_harness.engines.core.necessity import format_error
    from overlap_harness.engines.core.results import VariantOutcome, race_record

    started = time.process_time()
    tree = engine_tree(engine, source)
    side = engine_side(engine, source)
    names = list(variants) or side.variants
    unknown = [n for n in names if n not in side.variants]
    if unknown:
        raise SystemExit(f"unknown variant {', '.join(unknown)} (known: "
                         f"{', '.join(side.variants)})")
    files = {str(tree.file(c)): c for c in cover if tree.file(c).is_file()}
    files.update({str(Path(f).resolve()): c for f, c in list(files.items())})
    keeper = StackKeeper(tree.root)
    describer = _Describer(tree.root, keeper)
    measure = coverage.Coverage(data_file=None, include=sorted(files) or ["<nothing>"],
                                branch=False, config_file=False)
    result: dict[str, Any] = {"version": side.version, "root": str(tree.root),
                              "variants": names, "races": [], "errors": {},
                              "not_applicable": {}}
    outcomes = {}
    ran_races: list[tuple[str, list[Any], Any]] = []
    with keeper.installed():
        measure.start()
        try:
            for name in names:
                if (reason := side.not_applicable(name)) is not None:
                    result["not_applicable"][name] = reason
                    continue
                measure.switch_context(name)
                ran = time.process_time()
                try:
                    races, watch = side.run(name)
                except Exception as exc:  # this variant cannot be driven; the others go on
                    result["errors"][name] = format_error(exc)
                    continue
                ran_races.append((name, races, watch))
                outcomes[name] = VariantOutcome(name, [race_record(r, name) for r in races],
                                                seconds=time.process_time() - ran)
                print(f"  [{tree.root.name}] {name}: {len(races)} races "
                      f"({time.process_time() - ran:.2f} CPU s)", flush=True)
        finally:
            measure.stop()
    for name, races, watch in ran_races:  # described once coverage is off
        result["races"] += _races(name, races, watch, describer)
    data = measure.get_data()
    covered: dict[str, dict[str, list[str]]] = {}
    for measured in data.measured_files():
        relative = files.get(measured) or files.get(str(Path(measured).resolve()))
        if relative is not None:
            by_line = data.contexts_by_lineno(measured)
            entry = covered.setdefault(relative, {})
            for line, contexts in by_line.items():
                entry.setdefault(str(line), [])
                entry[str(line)] = sorted(set(entry[str(line)]) | {c for c in contexts if c})
    result["covered"] = covered
    if necessity:
        ok = [n for n in names if n in outcomes]
        result["necessity"] = [row.to_json() for row in side.necessity(ok, outcomes, jobs)]
    result["cpu_s"] = time.process_time() - started
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The child's command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="overlap_harness.engines.core.pr_view.child")
    parser.add_argument("engine", choices=("sglang", "vllm", "tokenspeed"))
    parser.add_argument("source")
    parser.add_argument("result", type=Path)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--cover", action="append", default=[])
    parser.add_argument("--necessity", action="store_true")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        result = run_side(args.engine, args.source, args.variant, args.cover, args.necessity,
                          args.jobs)
    except HarnessError as exc:  # the tree does not import: its line, for the parent to say
        args.result.write_text(json.dumps({"fatal": " ".join(str(exc).split())}))
        return 2
    args.result.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
