"""How the simulator scales: one dimension grown at a time, ops/s and peak memory per row.

Dimensions (issue 17, item 3):

* iterations 10 -> 10,000: the synthetic 3-stream program of ``sim_throughput.py`` (kernels on
  random 1-64-element index sets of four 4096-element buffers, 5% of fences dropped, a D2H
  copy per iteration, a host sync now and then), run for that many iterations; the same
  again as ``no-history``, on ``SimDevice(history=False)`` (the detector drops what can no
  longer race: bounded memory, the same races, no timeline or graph);
* streams 3 -> 8: the same program with forward-like streams added (each waits the forward
  stream's event and runs two kernels), 200 iterations;
* elements per access 1 -> 4,096: the same program with every index set that size, 200
  iterations;
* batch 8 -> 4,096: the spec-v2 protocol itself (``model.protocol`` on ``SimDevice``) with that
  many requests prefilled and decoded for 3 iterations (the request pool has 4,096 rows, row 0
  the padding row, so the largest batch is 4,095).

The detector's compiled pass is loaded before a row's clock starts (about 0.6 CPU s once per
process, which sim_throughput.py prints; once loaded, every run of the process uses it, and
the row's peak memory includes numba). Ops are the nodes the device issued (every kernel,
copy, record, wait, sync and host access).
Each row runs in a fresh process, so its peak resident memory (``ru_maxrss``, imports
included: about 0.3 GB of torch) is its own. Printed: ops, wall and CPU seconds, ops per wall
second and per CPU second (the machine is shared: CPU time is the steadier figure), peak MB.
Torch runs on one thread, as in the simulator. Run by hand:

    python benchmarks/scaling.py [--quick] [--only iterations|streams|elements|batch]

and record the table in docs/benchmarks.md. ``--quick`` stops each dimension one step early.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overlap_harness.model.shadow import warm_up  # noqa: E402
from overlap_harness.sim.sim_device import SimDevice  # noqa: E402  (after the path insert, run from anywhere)

DIMENSIONS: dict[str, list[int]] = {
    "iterations": [10, 100, 1_000, 10_000],
    "no-history": [10, 100, 1_000, 10_000],
    "streams": [3, 4, 6, 8],
    "elements": [1, 16, 256, 4_096],
    "batch": [8, 64, 512, 4_095],
}
FIXED_ITERATIONS = 200


def synthetic(iterations: int, streams: int = 3, elements: int = 0, seed: int = 0,
              history: bool = True) -> tuple[int, int]:
    """Run the synthetic overlap program; returns (ops issued, races found).

    ``elements`` = 0 draws each index set's size from 1..64; otherwise every set has exactly
    that many elements (buffers are at least that long). ``history`` is the device's.
    """
    rng = random.Random(seed)
    size = max(4096, elements)
    dev = SimDevice(host_launch_us=2.0, seed=seed, history=history)
    sched, fwd, d2h = (dev.stream(n) for n in ("schedule", "forward", "d2h"))
    extra = [dev.stream(f"aux{i}") for i in range(streams - 3)]
    bufs = [dev.buffer(f"b{i}", (size,), torch.int64, fill=0) for i in range(4)]
    pin = dev.buffer("pin", (64,), torch.int64, pinned=True, fill=0)
    ready = dev.event("ready")
    pools = [[np.array(sorted(rng.sample(range(size), elements or rng.randint(1, 64))))
              for _ in range(64)] for _ in range(4)]

    def kernel(stream) -> None:
        b = rng.randrange(4)
        reads, writes = pools[b][rng.randrange(64)], pools[b][rng.randrange(64)]
        out = torch.zeros(len(writes), dtype=torch.int64)
        dev.launch(stream, "k", lambda v, out=out: out, reads=[(bufs[b], reads)],
                   writes=[(bufs[b], writes)], cost_us=rng.randint(1, 50))

    for _ in range(iterations):
        for _ in range(3):
            kernel(sched)
        if rng.random() > 0.05:
            dev.wait_stream(fwd, sched)
        for _ in range(6):
            kernel(fwd)
        dev.record(ready, fwd)
        for aux in extra:
            dev.wait_event(aux, ready)
            kernel(aux)
            kernel(aux)
        dev.wait_event(d2h, ready)
        dev.copy(d2h, (bufs[0], slice(0, 64)), pin, non_blocking=True, cost_us=5)
        if rng.random() < 0.1:
            dev.synchronize(d2h)
            dev.host_read(pin, [0])
        if rng.random() > 0.05:
            dev.wait_stream(sched, fwd)
        for aux in extra:
            if rng.random() > 0.05:
                dev.wait_stream(sched, aux)
    races = len(dev.finish().races)
    return dev.op_count, races


BATCH_TOML = """\
name = "scaling_batch_{batch}"
[protocol]
mode = "spec_v2"
pool_size = 4096
max_context = 64
[workload]
iterations = 3
requests = [{requests}]
[check]
expect = "race_free"
"""


def protocol_batch(batch: int) -> tuple[int, int]:
    """The spec-v2 protocol with ``batch`` requests for 3 iterations; (ops, races)."""
    from overlap_harness.runner import simulate  # deferred: only this row needs the protocol
    from overlap_harness.scenarios.loader import load_scenario

    requests = ", ".join(f'{{ id = "r{i}", prompt_len = 16, max_new = 32 }}'
                         for i in range(batch))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"batch_{batch}.toml"
        path.write_text(BATCH_TOML.format(batch=batch, requests=requests))
        scenario = load_scenario(str(path))
    _, dev = simulate(scenario)
    run = dev.finish()
    return len(run.timeline), len(run.races)


def measure(dimension: str, value: int) -> dict[str, float]:
    """Run one row in this process; ops, races, wall and CPU seconds, peak resident MB."""
    torch.set_num_threads(1)
    warm_up()  # the detector's compiled pass: a one-off per process, as in sim_throughput.py
    wall, cpu = time.perf_counter(), time.process_time()
    if dimension == "iterations":
        ops, races = synthetic(value)
    elif dimension == "no-history":
        ops, races = synthetic(value, history=False)
    elif dimension == "streams":
        ops, races = synthetic(FIXED_ITERATIONS, streams=value)
    elif dimension == "elements":
        ops, races = synthetic(FIXED_ITERATIONS, elements=value)
    else:
        ops, races = protocol_batch(value)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ops": ops, "races": races, "wall_s": wall, "cpu_s": cpu, "peak_mb": peak_mb}


def row_in_child(dimension: str, value: int) -> dict[str, float]:
    """:func:`measure` in a fresh interpreter, so the peak memory is the row's own."""
    proc = subprocess.run([sys.executable, __file__, "--row", dimension, str(value)],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}  # type: ignore[dict-item]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="stop each dimension one step early")
    ap.add_argument("--only", choices=sorted(DIMENSIONS), help="one dimension")
    ap.add_argument("--row", nargs=2, metavar=("DIMENSION", "VALUE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(measure(args.row[0], int(args.row[1]))))
        return
    print("| dimension | value | ops | races | wall s | CPU s | ops/s wall | ops/s CPU "
          "| peak MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for dimension, values in DIMENSIONS.items():
        if args.only and dimension != args.only:
            continue
        for value in values[:-1] if args.quick else values:
            row = row_in_child(dimension, value)
            if "error" in row:
                print(f"| {dimension} | {value:,} | {row['error']} | | | | | | |", flush=True)
                continue
            print(f"| {dimension} | {value:,} | {row['ops']:,} | {row['races']:,} "
                  f"| {row['wall_s']:.2f} | {row['cpu_s']:.2f} "
                  f"| {row['ops'] / row['wall_s']:,.0f} | {row['ops'] / row['cpu_s']:,.0f} "
                  f"| {row['peak_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
