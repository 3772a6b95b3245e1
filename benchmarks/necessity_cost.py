"""SGLang's necessity table (every default variant) in two source trees, side by side.

    python benchmarks/necessity_cost.py BEFORE_TREE AFTER_TREE [--jobs 2] [--no-loop-report]

Runs, in turn, in each tree: ``python -m overlap_harness sglang --necessity -j JOBS -q
--json FILE``, then the same with ``--loop-report DIR`` (unless ``--no-loop-report``), on
the installed SGLang. Each run is a new process whose own sources come first on
``PYTHONPATH`` (a tree is a checkout, e.g. ``git archive COMMIT | tar -x -C /tmp/before``).
Printed per run: CPU seconds (user + system of the command and of every child it waited
for: the forked site and probe children), wall seconds, the exit status and the 1-minute
load average when it started and ended (the machine is shared: CPU is the steadier figure).

Then the verdicts: per (site, variant) row of the two trees' ``--json``, the verdict, the
reach count and the races that are not the caching allocator's reuse races (which buffer a
freed block goes to varies between runs of the same code: ``report/row_compare.py``); the
two loop reports against each other, and each against the committed
``reports/conformance/sglang-VERSION-loop.json`` of AFTER_TREE, with
``row_compare.differences``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def run_table(tree: Path, json_file: Path, loop_report: Path | None, jobs: int
              ) -> tuple[float, float, int, float, float]:
    """(CPU s, wall s, exit status, load average at the start and at the end) of one run in
    ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "overlap_harness", "sglang", "--necessity", "-j", str(jobs),
           "-q", "--json", str(json_file)]
    if loop_report is not None:
        cmd += ["--loop-report", str(loop_report)]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.returncode, load, os.getloadavg()[0]


def _rows(document: dict[str, Any]) -> dict[tuple[str, str], tuple[str, int, list[Any]]]:
    """Per (site as file:line under the tree, variant): the verdict, how often the mutated
    run reached the site, and the races other than allocator reuse, each as (kind, tensor,
    both sides' file and line)."""
    rows = {}
    for row in document["necessity"]:
        site = row["site"].split("/sglang/", 1)[-1]
        races = sorted((r["kind"], r["tensor"], r["first"]["file"].split("/sglang/", 1)[-1],
                        r["first"]["line"], r["second"]["file"].split("/sglang/", 1)[-1],
                        r["second"]["line"]) for r in row["races"] if r["kind"] != "reuse")
        rows[(site, row["variant"])] = (row["verdict"], row["reached"], races)
    return rows


def verdict_differences(before: Path, after: Path) -> list[str]:
    """The rows whose verdict or non-reuse races differ between the two ``--json`` files."""
    old, new = (_rows(json.loads(path.read_text())) for path in (before, after))
    problems = [f"{key}: only in one" for key in old.keys() ^ new.keys()]
    problems += [f"{key}: {old[key][0]} -> {new[key][0]}" for key in old.keys() & new.keys()
                 if old[key] != new[key]]
    return sorted(problems)


def main() -> int:
    """Run both trees, print the table and the comparisons."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-loop-report", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(args.after))
    from overlap_harness.engines.sglang.report import row_compare

    modes = [False] if args.no_loop_report else [False, True]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        for with_report in modes:
            for name, tree in (("before", args.before), ("after", args.after)):
                tag = f"{name}-{'report' if with_report else 'plain'}"
                report = out / tag if with_report else None
                cpu, wall, status, load, end = run_table(tree.resolve(), out / f"{tag}.json",
                                                         report, args.jobs)
                results.append((name, with_report, cpu, wall, status, load, end))
                print(f"{tag}: {cpu:.1f} CPU s, {wall:.1f} wall s, exit {status}, "
                      f"load {load:.2f} -> {end:.2f}", flush=True)
        print()
        print("| tree | --loop-report | CPU s | wall s | exit | load at start | at end |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for name, with_report, cpu, wall, status, load, end in results:
            print(f"| {name} | {'yes' if with_report else 'no'} | {cpu:.1f} | {wall:.1f} | "
                  f"{status} | {load:.2f} | {end:.2f} |")
        for with_report in modes:
            tag = "report" if with_report else "plain"
            differ = verdict_differences(out / f"before-{tag}.json", out / f"after-{tag}.json")
            print(f"\n{tag}: rows whose verdict or non-reuse races differ (before vs after): "
                  f"{len(differ)}")
            for line in differ[:20]:
                print(f"  {line}")
        if True in modes:
            version = json.loads((out / "after-report.json").read_text())["sglang_version"]
            committed = json.loads((args.after / "reports" / "conformance" /
                                    f"sglang-{version}-loop.json").read_text())
            written = {name: json.loads((out / f"{name}-report" /
                                         f"sglang-{version}-loop.json").read_text())
                       for name in ("before", "after")}
            differ = row_compare.differences(written["before"], written["after"])
            print(f"\nthe two loop reports (row_compare, before vs after): "
                  f"{len(written['after']['rows'])} rows, {len(differ)} differences")
            for line in differ[:20]:
                print(f"  {line}")
            for name in ("before", "after"):
                differ = row_compare.differences(committed, written[name])
                print(f"{name}'s loop report against the committed one (row_compare): "
                      f"{len(written['rows'])} rows, {len(differ)} differences")
                for line in differ[:20]:
                    print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
