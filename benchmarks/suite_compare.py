"""The bundled suite's time in two source trees, side by side, alternating, cold each time.

    python benchmarks/suite_compare.py BEFORE_TREE AFTER_TREE [--rounds 2]

Each round runs, in each tree and in turn, ``python -m overlap_harness run scenarios/ -q``
with its default reports (into a fresh temporary folder) and with ``--no-reports``. Every run
is a new process with an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` in a fresh
folder), so a one-off compile counts, as on a fresh machine. Printed per run: wall seconds
and CPU seconds of the process and its children (the machine is shared: CPU is the steadier
figure), and the exit status. A tree is a checkout, e.g. ``git worktree add --detach
/tmp/before <commit>``; its own sources are put first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_suite(tree: Path, reports: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, exit status) of one cold suite run in ``tree``."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, PYTHONPATH=str(tree), TORCHINDUCTOR_CACHE_DIR=scratch)
        out = ["--out", str(Path(scratch) / "reports")] if reports else ["--no-reports"]
        cmd = [sys.executable, "-m", "overlap_harness", "run", "scenarios/", "-q", *out]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print("| round | tree | reports | wall s | CPU s | exit |")
    print("|---:|---|---|---:|---:|---:|")
    for rnd in range(1, args.rounds + 1):
        for reports in (True, False):
            for name, tree in (("before", args.before), ("after", args.after)):
                wall, cpu, code = run_suite(tree.resolve(), reports)
                print(f"| {rnd} | {name} | {'default' if reports else '--no-reports'} "
                      f"| {wall:.1f} | {cpu:.1f} | {code} |", flush=True)


if __name__ == "__main__":
    main()
