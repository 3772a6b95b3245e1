"""Simulated ops per second with race detection on, beside simpy's bare event rate.

A synthetic 3-stream program (schedule, forward, d2h) of at least 100,000 ops shaped like the
overlap loop: kernels whose read and write sets are random index sets of 1 to 64 elements
over four 4096-element buffers, fences between the streams (5% of them dropped, so some races
are found and reported), a D2H copy per iteration and a host sync now and then. Every record,
wait and sync counts as an op (each is a node of the happens-before graph). Run by hand:

    python benchmarks/sim_throughput.py [--ops 100000] [--seed 0]

and record the printed table in docs/benchmarks.md. Figures are per process on one core.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import simpy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.device import SimDevice


def build_and_run(n_ops: int, seed: int) -> tuple[int, int, float]:
    """Issue ``n_ops`` device ops; returns (ops issued, races found, seconds)."""
    rng = random.Random(seed)
    dev = SimDevice(host_launch_us=2.0, seed=seed)
    streams = [dev.stream(n) for n in ("schedule", "forward", "d2h")]
    bufs = [dev.buffer(f"b{i}", (4096,), torch.int64, fill=0) for i in range(4)]
    pin = dev.buffer("pin", (64,), torch.int64, pinned=True, fill=0)
    ev = dev.event("ready")
    pools = [[np.array(rng.sample(range(4096), rng.randint(1, 64))) for _ in range(64)]
             for _ in range(4)]
    zero = torch.zeros(64, dtype=torch.int64)
    t0 = time.perf_counter()
    issued = 0
    sched, fwd, d2h = streams
    while issued < n_ops:
        # one overlap iteration: S prepares, F runs behind a fence, D copies out, and S is
        # fenced behind F again (5% of iterations drop a fence: some races to report)
        for stream, n in ((sched, 3), (fwd, 6)):
            if stream is fwd and rng.random() > 0.05:
                dev.wait_stream(fwd, sched)
                issued += 2
            for _ in range(n):
                b = rng.randrange(4)
                r = pools[b][rng.randrange(64)]
                w = pools[b][rng.randrange(64)]
                out = zero[: len(w)]
                dev.launch(stream, "k", lambda v, out=out: out, reads=[(bufs[b], r)],
                           writes=[(bufs[b], w)], cost_us=rng.randint(1, 50))
                issued += 1
        dev.record(ev, fwd)
        dev.wait_event(d2h, ev)
        dev.copy(d2h, (bufs[0], slice(0, 64)), pin, non_blocking=True, cost_us=5)
        issued += 3
        if rng.random() < 0.1:
            dev.synchronize(d2h)
            dev.host_read(pin, [0])
            issued += 2
        if rng.random() > 0.05:
            dev.wait_stream(sched, fwd)
            issued += 2
    run = dev.finish()
    return issued, len(run.races), time.perf_counter() - t0


def simpy_rate(n: int) -> float:
    """Bare simpy: timeouts processed per second by one process."""
    env = simpy.Environment()

    def proc(env: simpy.Environment):
        for _ in range(n):
            yield env.timeout(1)

    env.process(proc(env))
    t0 = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ops, races, secs = build_and_run(args.ops, args.seed)
    bare = simpy_rate(args.ops)
    print("| measure | value |")
    print("|---|---|")
    print(f"| ops simulated (3 streams, 1-64-element index sets) | {ops} |")
    print(f"| races found | {races} |")
    print(f"| wall time (s) | {secs:.2f} |")
    print(f"| SimDevice ops/s, race detection and values on | {ops / secs:,.0f} |")
    print(f"| simpy bare timeouts/s, same machine | {bare:,.0f} |")
    print(f"| ratio SimDevice / bare simpy | {ops / secs / bare:.3f} |")


if __name__ == "__main__":
    main()
