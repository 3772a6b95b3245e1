"""Where the simulator's CPU goes: the shares of sim_throughput's timed region, by part.

A sampling profiler (``signal.setitimer(ITIMER_PROF)``, a tick per millisecond of CPU) over
``sim_throughput.measure``: each tick charges the CPU time since the previous one to the
innermost frame of a known file (numpy, torch and numba calls have no Python frame, so they
count for the caller that made them; a signal that arrives during a long C call waits for its
end, which is why the time, not the tick, is charged). Garbage-collector passes are timed
apart through ``gc.callbacks`` and taken out of the tick they fell in. Unlike a deterministic
profiler this adds no cost per call, so small functions are not inflated.
Run by hand, and record the table in docs/benchmarks.md:

    python benchmarks/cost_shares.py [--ops 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_throughput

# (path fragment, function name or None for any) -> part; the first match, innermost frame out
PARTS: list[tuple[str, str | None, str]] = [
    ("model/detector.py", "_race", "race records (built when read)"),
    ("model/detector.py", "races", "race records (built when read)"),
    ("model/node_rows.py", None, "race records (built when read)"),
    ("sim/sim_device.py", "timeline", "timeline records (built when read)"),
    ("model/shadow_kernel.py", None, "detector: element checks (compiled pass and its glue)"),
    ("model/shadow.py", None, "detector: element checks (compiled pass and its glue)"),
    ("model/detector.py", None, "detector: clocks, rows, queue"),
    ("sim/op_values.py", None, "values: snapshots, functions, landing"),
    ("sim/fn_inputs.py", None, "values: snapshots, functions, landing"),
    ("simpy/", None, "simpy: event heap and steps"),
    ("sim/sim_device.py", None, "issue path: device API, timing, tracking"),
    ("model/device.py", None, "issue path: device API, timing, tracking"),
    ("model/allocator.py", None, "issue path: device API, timing, tracking"),
    ("benchmarks/sim_throughput.py", None, "benchmark loop (the user's side)"),
]


_COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


def part_of(frame: FrameType | None) -> str:
    """The part a sample at ``frame`` is charged to. A comprehension's frame counts as the
    function it is in (a record built in ``[OpRecord(...) for ...]`` belongs to ``timeline``)."""
    while frame is not None:
        path = frame.f_code.co_filename.replace("\\", "/")
        name = frame.f_code.co_name
        if name in _COMPREHENSIONS:
            frame = frame.f_back
            continue
        for fragment, function, part in PARTS:
            if fragment in path and (function is None or function == name):
                return part
        frame = frame.f_back
    return "other"


def sample(n_ops: int, seed: int) -> tuple[Counter, float, float]:
    """One measured run under the sampler: (CPU seconds by part, GC seconds, CPU seconds)."""
    counts: Counter = Counter()
    collecting: list[float] = []
    gc_seconds = [0.0]
    last_tick = [time.process_time(), 0.0]  # CPU clock at the last tick, GC seconds since

    def on_tick(_signum: int, frame: FrameType | None) -> None:
        now = time.process_time()
        # a tick held back by a collection is taken in the callback that ends it, before the
        # callback has counted it: all of it is the collector's
        part = "garbage collector (and these hooks)" if collecting else part_of(frame)
        counts[part] += now - last_tick[0] - last_tick[1]
        counts["garbage collector (and these hooks)"] += last_tick[1]
        last_tick[0], last_tick[1] = now, 0.0

    def on_gc(phase: str, _info: dict) -> None:
        if phase == "start":
            collecting.append(time.process_time())
        elif collecting:
            spent = time.process_time() - collecting.pop()
            gc_seconds[0] += spent
            last_tick[1] += spent

    @contextlib.contextmanager
    def sampled() -> Iterator[None]:
        signal.signal(signal.SIGPROF, on_tick)
        gc.callbacks.append(on_gc)
        last_tick[0] = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
            gc.callbacks.remove(on_gc)
            on_tick(0, None)  # the time since the last tick, as "other"

    cpu = sim_throughput.measure(n_ops, seed, sampled).cpu
    return counts, gc_seconds[0], cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="measured runs, samples summed")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sim_throughput.measure(2_000, args.seed)  # imports, the compiled pass, caches: not sampled
    total: Counter = Counter()
    gc_total = cpu_total = 0.0
    for _ in range(args.rounds):
        counts, gc_seconds, cpu = sample(args.ops, args.seed)
        total.update(counts)
        gc_total += gc_seconds
        cpu_total += cpu
    charged = sum(total.values())
    per_op_us = cpu_total / args.rounds / args.ops * 1e6
    print(f"{args.rounds} runs of {args.ops} ops, {cpu_total / args.rounds:.2f} CPU s each "
          f"({per_op_us:.1f} us per op; {charged / cpu_total:.0%} of it charged to a part); "
          f"garbage collector {gc_total / args.rounds:.3f} s per run")
    print("| part | share of CPU | us per op |")
    print("|---|---:|---:|")
    for part, seconds in total.most_common():
        share = seconds / charged
        print(f"| {part} | {share:.0%} | {share * per_op_us:.2f} |")


if __name__ == "__main__":
    main()
