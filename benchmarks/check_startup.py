"""What ``overlap-harness check`` and ``watch()`` cost against the plain run of the same small
script (issue 35, item 1: at most 1.5x), and what the package's pytest plugins add to a pytest
run that asks nothing of them (item 2: nothing heavy imported).

Each row is a fresh process (what a user pays, imports included), its CPU seconds (user +
system, from ``resource.getrusage`` of the children) beside wall seconds, best of
``--repeat``; the rows run interleaved, one round after another, so a loaded machine weighs on
all of them alike. The script is ten ops on two streams when CUDA is there (faked on the CPU
under the recorder) and the same ops on the CPU when run plainly.

Usage: ``python benchmarks/check_startup.py [--repeat N]``.
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

SCRIPT = """\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
weights = torch.randn(64, 64, device=device)
data = torch.randn(64, 64, device=device)
out = torch.relu(data @ weights)
if device == "cuda":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.mul_(2)
    torch.cuda.current_stream().wait_stream(side)
else:
    out.mul_(2)
total = out.sum()
print(float(total) != 0.0)
"""

WATCHED = """\
import runpy
import sys

from overlap_harness import watch

with watch(mode="cpu") as w:
    runpy.run_path(sys.argv[1], run_name="__main__")
print(len(w.races), "races")
"""

TEST_FILE = "def test_app():\n    assert 1 + 1 == 2\n"

#: The package's pytest11 entry points, by name (pyproject.toml).
OUR_PLUGINS = ("overlap_harness", "overlap_harness_races",
               "overlap_harness.engines.sglang.pytest_items",
               "overlap_harness.engines.vllm.pytest_items")


def timed(command: list[str], cwd: Path) -> tuple[float, float]:
    """CPU and wall seconds of one run of ``command`` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTEST_ADDOPTS": ""})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    python = sys.executable
    cli = str(Path(python).with_name("overlap-harness"))
    blocked = [arg for name in OUR_PLUGINS for arg in ("-p", f"no:{name}")]
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "ten_ops.py").write_text(SCRIPT)
        (work / "watched.py").write_text(WATCHED)
        (work / "test_app.py").write_text(TEST_FILE)
        rows = {
            "plain: python ten_ops.py": [python, "ten_ops.py"],
            "overlap-harness check ten_ops.py": [cli, "check", "ten_ops.py"],
            "watch(): python watched.py ten_ops.py": [python, "watched.py", "ten_ops.py"],
            "pytest, our plugins blocked (-p no:...)": [python, "-m", "pytest", "-q",
                                                        "-p", "no:cacheprovider", *blocked],
            "pytest, our plugins loaded, no option": [python, "-m", "pytest", "-q",
                                                      "-p", "no:cacheprovider"],
        }
        best = {name: (float("inf"), float("inf")) for name in rows}
        for _ in range(args.repeat):
            for name, command in rows.items():
                cpu, wall = timed(command, work)
                best[name] = (min(best[name][0], cpu), min(best[name][1], wall))
    plain_cpu = best["plain: python ten_ops.py"][0]
    print(f"best of {args.repeat}, fresh processes")
    print(f"| {'run':<42} | CPU s | wall s | CPU / plain run |")
    print(f"|{'-' * 44}|------:|-------:|----------------:|")
    for name, (cpu, wall) in best.items():
        ratio = f"{cpu / plain_cpu:.2f}x" if not name.startswith("pytest") else ""
        print(f"| {name:<42} | {cpu:5.2f} | {wall:6.2f} | {ratio:>15} |")


if __name__ == "__main__":
    main()
