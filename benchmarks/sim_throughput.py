"""Simulated ops per second with race detection on, beside simpy's bare event rate.

A synthetic 3-stream program (schedule, forward, d2h) of at least 100,000 ops shaped like the
overlap loop: kernels whose read and write sets are random index sets of 1 to 64 elements
over four 4096-element buffers, fences between the streams (5% of them dropped, so some races
are found and reported), a D2H copy per iteration and a host sync now and then. Every record,
wait and sync counts as an op (each is a node of the happens-before graph). Run by hand:

    python benchmarks/sim_throughput.py [--ops 100000] [--seed 0]
    python benchmarks/sim_throughput.py --baseline /tmp/old-tree [--rounds 2]

and record the printed table in docs/benchmarks.md. Figures are per process, torch on one
thread; ops per CPU second is the steadier figure on a shared machine. ``--baseline`` runs the
same program on another checkout (a ``git worktree`` of the commit before a change) in fresh
processes, alternating with this tree, and checks that both find the same races (a digest of
every racing pair).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import simpy
import torch

# the tree whose simulator runs: this checkout, or the one a --baseline child is told to use
TREE_ENV = "SIM_THROUGHPUT_TREE"
HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get(TREE_ENV, str(HERE)))

from overlap_harness.sim.sim_device import SimDevice  # noqa: E402  (after the tree is chosen)

try:  # the compiled detector pass (trees since session 6); earlier trees have none
    from overlap_harness.model.shadow import warm_up
except ImportError:
    def warm_up() -> None:
        """Nothing to load in a tree without the compiled pass."""


class Measurement(NamedTuple):
    """One run of the benchmark: what :func:`measure` returns."""

    ops: int  # ops issued (nodes of the happens-before graph)
    races: int  # racing pairs found
    wall: float  # seconds of the timed region: issue the program, then finish
    cpu: float  # CPU seconds of the same
    digest: str  # of every racing pair: the same races in two trees
    records_cpu: float  # CPU seconds to build every timeline and race record afterwards


def build_and_run(n_ops: int, seed: int) -> tuple[int, int, float]:
    """Issue ``n_ops`` device ops; returns (ops issued, races found, seconds)."""
    run = measure(n_ops, seed)
    return run.ops, run.races, run.wall


def build_program(n_ops: int, seed: int) -> tuple[list[list[np.ndarray]], list[tuple]]:
    """The random program, drawn before anything is timed: the index pools and the steps.

    The draws are those the loop of earlier versions made while it issued (same generator,
    same order), so the program, and with it the race digest, is unchanged; drawing it first
    keeps ``random.Random`` out of what is timed. A step is ``("wait_stream", waiter,
    other)``, ``("kernel", stream, buffer, read pool index, write pool index, cost_us)`` or
    ``("tail", synchronize, fence)`` (the end of an iteration; streams by index: schedule,
    forward, d2h)."""
    rng = random.Random(seed)
    pools = [[np.array(rng.sample(range(4096), rng.randint(1, 64))) for _ in range(64)]
             for _ in range(4)]
    steps: list[tuple] = []
    issued = 0
    while issued < n_ops:
        # one overlap iteration: S prepares, F runs behind a fence, D copies out, and S is
        # fenced behind F again (5% of iterations drop a fence: some races to report)
        for stream, n in ((0, 3), (1, 6)):
            if stream == 1 and rng.random() > 0.05:
                steps.append(("wait_stream", 1, 0))
                issued += 2
            for _ in range(n):
                b = rng.randrange(4)
                r = rng.randrange(64)
                w = rng.randrange(64)
                steps.append(("kernel", stream, b, r, w, rng.randint(1, 50)))
                issued += 1
        issued += 3  # record, wait, copy
        sync = rng.random() < 0.1
        issued += 2 * sync
        fence = rng.random() > 0.05
        issued += 2 * fence
        steps.append(("tail", sync, fence))
    return pools, steps


def drawn_kernels(pools: list[list[np.ndarray]], steps: list[tuple], streams: list,
                  buffers: list) -> list[tuple]:
    """Each kernel step's (stream, function, reads, writes, cost_us), made before anything is
    timed, as a user's code holds them: ``streams`` and ``buffers`` by index are the device's
    (or a stand-in's). A kernel's function returns a fixed tensor of its write's size and
    reads nothing."""
    zero = torch.zeros(64, dtype=torch.int64)
    kernels = []
    for step in steps:
        if step[0] == "kernel":
            _kind, stream, b, r, w, cost = step
            out = zero[: len(pools[b][w])]
            kernels.append((streams[stream], lambda v, out=out: out,
                            [(buffers[b], pools[b][r])], [(buffers[b], pools[b][w])], cost))
    return kernels


def measure(n_ops: int, seed: int, timed_region: Callable[[], contextlib.AbstractContextManager]
            = contextlib.nullcontext) -> Measurement:
    """Issue ``n_ops`` device ops and let them land (:class:`Measurement`). What is timed is
    the simulator: issuing the drawn program, then ``finish``, which has found every racing
    pair; it runs inside ``timed_region()`` (``cost_shares.py`` samples it there). A device
    builds the run's records (an ``OpRecord`` per op, a ``Race`` per pair) when they are
    first read; this reads them all after the clock stops and times that apart
    (``records_cpu``): the digest needs them, and a user who reads them pays it.

    Before the clock starts, as the CLI's runner does before its runs: the detector's
    compiled pass is loaded (a one-off per process, :func:`load_seconds`), and ``gc.freeze``
    moves what the imports and the setup made out of the collector's way (a full collection
    walks every tracked object, and torch's import alone makes about 166,000)."""
    pools, steps = build_program(n_ops, seed)
    dev = SimDevice(host_launch_us=2.0, seed=seed)
    streams = [dev.stream(n) for n in ("schedule", "forward", "d2h")]
    bufs = [dev.buffer(f"b{i}", (4096,), torch.int64, fill=0) for i in range(4)]
    pin = dev.buffer("pin", (64,), torch.int64, pinned=True, fill=0)
    ev = dev.event("ready")
    kernels = drawn_kernels(pools, steps, streams, bufs)
    warm_up()
    gc.freeze()
    with timed_region():
        t0, c0 = time.perf_counter(), time.process_time()
        issued, run = _issue(dev, steps, kernels, streams, bufs, pin, ev)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    c0 = time.process_time()
    _records = len(run.timeline) + len(run.races)
    records_cpu = time.process_time() - c0
    digest = hashlib.sha256(repr(sorted(
        (str(r.kind), r.buffer, r.elements, r.first.op, r.second.op, r.older)
        for r in run.races)).encode()).hexdigest()[:16]
    return Measurement(issued, len(run.races), wall, cpu, digest, records_cpu)


def _issue(dev: SimDevice, steps: list[tuple], kernels: list[tuple], streams: list,
           bufs: list, pin: object, ev: object) -> tuple[int, object]:
    """The timed part: issue the drawn steps, then ``finish``; returns (ops issued, run)."""
    sched, fwd, d2h = streams
    issued = 0
    kernel_at = 0
    for step in steps:
        kind = step[0]
        if kind == "kernel":
            stream, fn, reads, writes, cost = kernels[kernel_at]
            kernel_at += 1
            dev.launch(stream, "k", fn, reads=reads, writes=writes, cost_us=cost)
            issued += 1
        elif kind == "wait_stream":
            dev.wait_stream(streams[step[1]], streams[step[2]])
            issued += 2
        else:
            dev.record(ev, fwd)
            dev.wait_event(d2h, ev)
            dev.copy(d2h, (bufs[0], slice(0, 64)), pin, non_blocking=True, cost_us=5)
            issued += 3
            if step[1]:
                dev.synchronize(d2h)
                dev.host_read(pin, [0])
                issued += 2
            if step[2]:
                dev.wait_stream(sched, fwd)
                issued += 2
    return issued, dev.finish()


def load_seconds() -> float:
    """CPU seconds to load the detector's compiled pass in a fresh process (0 in a tree
    without it): paid once per process, outside the timed region."""
    out = subprocess.run([sys.executable, "-c", "import time, sys; sys.path.insert(0, sys.argv[1]);"
                          "from overlap_harness.model.detector import HBDetector;"
                          "from overlap_harness.model.shadow import warm_up;"
                          "c = time.process_time(); warm_up(); print(time.process_time() - c)",
                          os.environ.get(TREE_ENV, str(HERE))],
                         capture_output=True, text=True, check=False)
    return float(out.stdout.strip() or 0.0)


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


def child_run(tree: Path, n_ops: int, seed: int) -> dict:
    """One measurement in a fresh process on the simulator of ``tree``."""
    env = dict(os.environ, **{TREE_ENV: str(tree)})
    out = subprocess.run([sys.executable, __file__, "--ops", str(n_ops), "--seed", str(seed),
                          "--json"], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(baseline: Path, n_ops: int, seed: int, rounds: int) -> None:
    """Alternate this tree and ``baseline``, ``rounds`` times each; print one table."""
    rows: list[tuple[str, dict]] = []
    for _ in range(rounds):
        for label, tree in (("before", baseline), ("after", HERE)):
            rows.append((label, child_run(tree, n_ops, seed)))
    print("| tree | ops | races | race digest | wall s | CPU s | ops/s wall | ops/s CPU | "
          "+ records read, CPU s | ops/s CPU, records read |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, r in rows:
        with_records = r["cpu"] + r.get("records_cpu", 0.0)
        print(f"| {label} | {r['ops']} | {r['races']} | {r['digest']} | {r['wall']:.2f} | "
              f"{r['cpu']:.2f} | {r['ops'] / r['wall']:,.0f} | {r['ops'] / r['cpu']:,.0f} | "
              f"{r.get('records_cpu', 0.0):.2f} | {r['ops'] / with_records:,.0f} |")
    if len({r["digest"] for _label, r in rows}) != 1:
        print("RACES DIFFER between the trees", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", type=Path, help="another checkout to run side by side")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each tree with --baseline")
    ap.add_argument("--json", action="store_true", help="one measurement as a JSON line")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.baseline is not None:
        if not (args.baseline / "sim" / "sim_device.py").is_file():
            sys.exit(f"sim_throughput: --baseline {args.baseline}: no sim/sim_device.py there")
        compare(args.baseline, args.ops, args.seed, args.rounds)
        return
    ops, races, wall, cpu, digest, records_cpu = measure(args.ops, args.seed)
    if args.json:
        print(json.dumps({"ops": ops, "races": races, "wall": wall, "cpu": cpu,
                          "digest": digest, "records_cpu": records_cpu}))
        return
    bare = simpy_rate(args.ops)
    print("| measure | value |")
    print("|---|---|")
    print(f"| ops simulated (3 streams, 1-64-element index sets) | {ops} |")
    print(f"| races found (digest {digest}) | {races} |")
    print(f"| wall time (s) / CPU time (s) | {wall:.2f} / {cpu:.2f} |")
    print(f"| SimDevice ops/s wall, race detection and values on | {ops / wall:,.0f} |")
    print(f"| SimDevice ops/s CPU | {ops / cpu:,.0f} |")
    print(f"| then every timeline and race record read, CPU s | {records_cpu:.2f} |")
    print(f"| SimDevice ops/s CPU, the records read too | {ops / (cpu + records_cpu):,.0f} |")
    print(f"| simpy bare timeouts/s, same machine | {bare:,.0f} |")
    print(f"| one-off load of the compiled detector pass, CPU s (not timed above) | "
          f"{load_seconds():.2f} |")
    print(f"| ratio SimDevice (wall) / bare simpy | {ops / wall / bare:.3f} |")


if __name__ == "__main__":
    main()
