"""CPU seconds of the suite's reports alone, by kind, in this tree and optionally another.

    python benchmarks/report_costs.py [--baseline TREE] [--rounds 2]

The suite is simulated once (here, ``-j 2``) and its results pickled; then each tree, in a
fresh process of its own (its sources first on ``PYTHONPATH``), writes the reports of those
same results and times each kind in CPU seconds (``time.process_time``): a plot worker's
start (``plot_jobs._start_worker``: matplotlib's import and warm-up), every timeline PNG
drawn as a plot worker draws it (``plot_jobs.draw_png``, one process, so every plot shares
its caches, as with one worker), then results.json, the Perfetto trace, SARIF, JUnit and
the two summaries. The simulation is not timed: it is another engineer's, and it changes
(issue 17 item 2 asks for the report share apart). Rounds alternate the trees. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("worker start", "plots", "results.json", "trace", "sarif", "junit", "summaries")


def measure(results_path: Path, out: Path) -> dict[str, float]:
    """CPU seconds per report kind for the pickled results, with the tree on sys.path."""
    from overlap_harness.reports import plot_jobs
    from overlap_harness.reports.jsonout import to_json
    from overlap_harness.reports.junit import write_junit
    from overlap_harness.reports.perfetto import write_trace
    from overlap_harness.reports.sarif import write_sarif
    from overlap_harness.reports.summary import needs_plot, to_html, to_markdown
    from overlap_harness.reports.writer import safe_name, write_text

    results = pickle.loads(results_path.read_bytes())
    spent: dict[str, float] = {}

    def timed(kind: str, work) -> object:
        start = time.process_time()
        value = work()
        spent[kind] = time.process_time() - start
        return value

    timed("worker start", plot_jobs._start_worker)
    (out / "plots").mkdir(parents=True)
    pngs = timed("plots", lambda: {
        r.run_id: Path(plot_jobs.draw_png(r, str(out / "plots" / f"{safe_name(r.run_id)}.png")))
        for r in results if needs_plot(r)})
    spent["plot count"] = len(pngs)
    timed("results.json", lambda: write_text(out / "results.json",
                                             to_json(results, with_timeline=True)))
    timed("trace", lambda: write_trace(results, out / "trace.json"))
    timed("sarif", lambda: write_sarif(results, out / "results.sarif"))
    timed("junit", lambda: write_junit(results, out / "junit.xml"))
    rel = {k: str(v.relative_to(out)) for k, v in pngs.items()}
    timed("summaries", lambda: (to_markdown(results, rel, (), None),
                                to_html(results, pngs, (), None)))
    return spent


def run_tree(tree: Path, results_path: Path) -> dict[str, float]:
    """:func:`measure` in a fresh process with ``tree``'s sources first."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=str(tree))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--measure",
                               str(results_path), out], cwd=tree, env=env,
                              capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def simulate_suite(path: Path) -> int:
    """Run the suite here (``-j 2``) and pickle its results to ``path``; returns the runs."""
    sys.path.insert(0, str(ROOT))
    from overlap_harness.runner import run_scenarios
    from overlap_harness.scenarios.loader import load_paths

    results = run_scenarios(load_paths([ROOT / "scenarios"], runnable=True), jobs=2)
    path.write_bytes(pickle.dumps(results))
    return len(results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="another tree, measured alternately")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--measure", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(*args.measure)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        results_path = Path(scratch) / "results.pickle"
        runs = simulate_suite(results_path)
        trees = [("baseline", args.baseline)] if args.baseline else []
        trees.append(("this tree", ROOT))
        print(f"{runs} runs; CPU seconds per report kind\n")
        print("| round | tree | plots | per plot | " + " | ".join(KINDS) + " | total |")
        print("|---:|---|---:|---:|" + "---:|" * (len(KINDS) + 1))
        for rnd in range(1, args.rounds + 1):
            for name, tree in trees:
                spent = run_tree(tree.resolve(), results_path)
                count = int(spent.pop("plot count"))
                cells = " | ".join(f"{spent[k]:.2f}" for k in KINDS)
                print(f"| {rnd} | {name} | {count} | {spent['plots'] / max(count, 1):.3f} | "
                      f"{cells} | {sum(spent.values()):.2f} |", flush=True)


if __name__ == "__main__":
    main()
