"""Recording overhead of the recorder in CPU mode (issue 15: at most 20x the script's own run).

Two measurements, each as CPU time (``time.process_time``) beside wall time:

1. The corpus (tests/recorder_corpus/*.py): every program run with CUDA faked on the CPU and
   the recorder on, against the same program with the recorder off (the dispatch mode paused
   from the start: the program's own torch work on the CPU, streams and events as no-ops).
   A corpus program cannot run on a CPU-only torch without the fake device, so that is its
   own CPU run. The ratio is the overhead; the bar is 20x.
2. Throughput: a two-stream producer/consumer loop (kernels, event record/wait, index writes
   of a few rows), in ops recorded and checked per second.

Usage: ``python3 benchmarks/recorder_overhead.py [--repeat N] [--ops N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overlap_harness.recorder import watch  # noqa: E402  (after the repository root is on sys.path)

CORPUS = ROOT / "tests" / "recorder_corpus"
BAR = 20.0


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Best CPU and wall seconds of ``repeat`` runs of ``fn``."""
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return best_cpu, best_wall


def run_program(path: Path, recording: bool) -> int:
    """Run one corpus program under the fake device; returns the ops recorded."""
    with watch("cpu") as watcher, contextlib.redirect_stdout(io.StringIO()):
        if not recording:
            watcher.dispatch.paused += 1
        runpy.run_path(str(path), run_name="__main__")
    return len(watcher.run.timeline)


def corpus_rows(repeat: int) -> list[tuple[str, int, float, float, float, float]]:
    sys.path.insert(0, str(CORPUS))  # the programs import corpus_helper beside them
    rows = []
    for path in sorted(CORPUS.glob("*_racy.py")) + sorted(CORPUS.glob("*_fixed.py")):
        ops = run_program(path, True)  # warm-up, and the op count
        base_cpu, base_wall = timed(lambda p=path: run_program(p, False), repeat)
        rec_cpu, rec_wall = timed(lambda p=path: run_program(p, True), repeat)
        rows.append((path.name, ops, base_cpu, base_wall, rec_cpu, rec_wall))
    return rows


def producer_consumer(iterations: int) -> None:
    """Two streams relay a (64, 8) buffer a few rows at a time, ordered by events (race-free:
    the detector's cost of reporting races is not what this measures)."""
    producer = torch.cuda.Stream()
    table = torch.zeros(64, 8, device="cuda")
    ready = torch.cuda.Event()
    for step in range(iterations):
        rows = torch.tensor([step % 64, (step * 7) % 64], device="cuda")
        producer.wait_stream(torch.cuda.current_stream())  # rows, and the last reads of table
        with torch.cuda.stream(producer):
            table[rows] = float(step)
            ready.record()
        torch.cuda.current_stream().wait_event(ready)
        table.index_select(0, rows).sum()


def throughput(iterations: int, repeat: int) -> tuple[int, float, float]:
    """Nodes recorded by one run of the loop, and its best CPU and wall seconds."""
    ops = races = 0

    def once() -> None:
        nonlocal ops, races
        with watch("cpu") as watcher:
            producer_consumer(iterations)
        ops, races = len(watcher.run.timeline), len(watcher.races)
    cpu, wall = timed(once, repeat)
    assert races == 0, f"the throughput loop should be race-free, found {races} races"
    return ops, cpu, wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best)")
    parser.add_argument("--ops", type=int, default=500, help="throughput loop iterations")
    args = parser.parse_args(argv)
    rows = corpus_rows(args.repeat)
    print(f"{'program':<36} {'ops':>4} {'own cpu ms':>10} {'rec cpu ms':>10} {'ratio':>6}"
          f" {'own wall ms':>11} {'rec wall ms':>11}")
    worst = 0.0
    for name, ops, base_cpu, base_wall, rec_cpu, rec_wall in rows:
        ratio = rec_cpu / base_cpu if base_cpu > 0 else float("inf")
        worst = max(worst, ratio)
        print(f"{name:<36} {ops:>4} {base_cpu * 1e3:>10.2f} {rec_cpu * 1e3:>10.2f} "
              f"{ratio:>5.1f}x {base_wall * 1e3:>11.2f} {rec_wall * 1e3:>11.2f}")
    total_base = sum(r[2] for r in rows)
    total_rec = sum(r[4] for r in rows)
    print(f"corpus: {len(rows)} programs, recording costs {total_rec / total_base:.1f}x their "
          f"own CPU time in all, {worst:.1f}x at worst (bar {BAR:g}x)")
    total_ops = sum(r[1] for r in rows)
    print(f"corpus: {total_ops} ops recorded and checked in {total_rec:.3f} s CPU: "
          f"{total_ops / total_rec:,.0f} recorded ops/s (the program's own work included)")
    ops, cpu, wall = throughput(args.ops, args.repeat)
    print(f"throughput: {ops} ops recorded and checked in {cpu:.3f} s CPU ({wall:.3f} s wall): "
          f"{ops / cpu:,.0f} ops/s")
    return 0 if worst <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
