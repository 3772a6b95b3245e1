"""What a pull request's view costs beside one tree's run: ``overlap-harness sglang`` on one
tree, then ``--base`` comparing a twin of that tree (one harmless edit in the scheduler) with
the tree, every variant. CPU seconds are this process's children (each command is a child;
the view's own children, the two trees' runs, are counted through it), wall beside them.
Run by hand, and record the table in docs/benchmarks.md:

    python benchmarks/pr_view_cost.py [--variant NAME]... [-j 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EDITED = "sglang/srt/managers/scheduler.py"
ANCHOR = "self.forward_stream.wait_stream(self.schedule_stream)"


def _twin(folder: Path, edited: bool) -> Path:
    installed = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    folder.mkdir()
    subprocess.run(["cp", "-rs", str(installed), str(folder / "sglang")], check=True)
    if edited:
        path = folder / EDITED
        lines = path.read_text().splitlines(keepends=True)
        index = next(i for i, line in enumerate(lines) if line.strip() == ANCHOR)
        indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
        lines.insert(index + 1, f"{indent}_reviewed = True\n")
        path.unlink()
        path.write_text("".join(lines))
    return folder


def _timed(arguments: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "overlap_harness", *arguments],
                          capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("-j", "--jobs", default="1")
    args = parser.parse_args()
    variants = [w for name in args.variant for w in ("--variant", name)]
    with tempfile.TemporaryDirectory() as scratch:
        base = _twin(Path(scratch) / "base", edited=False)
        head = _twin(Path(scratch) / "head", edited=True)
        one = _timed(["sglang", "--sglang-src", str(base), *variants])
        view = _timed(["sglang", "--sglang-src", str(head), "--base", str(base), "-j",
                       args.jobs, *variants])
    print("| run | exit | CPU s | wall s |\n|---|---|---|---|")
    print(f"| one tree | {one[2]} | {one[0]:.1f} | {one[1]:.1f} |")
    print(f"| --base (both trees, -j {args.jobs}) | {view[2]} | {view[0]:.1f} | {view[1]:.1f} |")
    print(f"\nratio (CPU): {view[0] / one[0]:.2f}x")


if __name__ == "__main__":
    main()
