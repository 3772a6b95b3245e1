"""The ceiling of a device driven one Python call per op: the benchmark's program on devices
that do less and less than ``SimDevice``, side by side in one process.

``sim_throughput.py`` issues its drawn program (3 streams, kernels on 1-64-element index sets,
fences, D2H copies, host syncs) through ``SimDevice``, one API call per op. Whatever the
simulator does, the user's loop makes those calls and every value op runs its Python function
and lands its torch results. This runs the same program on stripped devices, each adding one
layer of the least work a device must do, to show where the ceiling of that API is:

* ``loop``: the user's loop, with device methods that return at once;
* ``+ issue``: the caller's ``file:line`` looked up per op (a race must name the user's line),
  start and end times per stream, one row tuple per node, the element arrays kept;
* ``+ events``: one ``heapq`` entry per value op, popped in (time, op) order at host syncs and
  at the end (simpy's role, at a plain heap's cost);
* ``+ values``: each value op's function called on its inputs' live memory (no snapshot) and
  its torch results landed through numpy (``out.numpy()``, then one index assignment).

None of them has vector clocks, element checks, snapshots or the written/landed tracking, so
each is an upper bound on a full device. Run by hand and record the table in docs/benchmarks.md:

    python benchmarks/python_floor.py [--ops 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sim_throughput

LAYERS = ("loop", "+ issue", "+ events", "+ values")


class StrippedDevice:
    """The least a device driven per op does, up to ``layer`` (an index into LAYERS)."""

    def __init__(self, layer: int) -> None:
        self.layer = layer
        self.host_ns = 0
        self.free_at = [0, 0, 0]
        self.rows: list[tuple] = []
        self.elements: list[np.ndarray] = []
        self.sources: dict[tuple, str] = {}
        self.heap: list[tuple] = []

    def _source(self) -> str:
        frame = sys._getframe(2)
        key = (frame.f_code, frame.f_lineno)
        source = self.sources.get(key)
        if source is None:
            source = self.sources[key] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        return source

    def launch(self, stream: int, name: str, fn: Callable, reads: list, writes: list,
               cost_ns: int) -> None:
        """A kernel or copy: timing, a row, its element arrays, an event, its values."""
        if not self.layer:
            return
        source = self._source()
        self.host_ns += 2000
        free = self.free_at[stream]
        start = self.host_ns if self.host_ns >= free else free
        end = self.free_at[stream] = start + cost_ns
        op = len(self.rows)
        self.rows.append((op, name, stream, source, start, end))
        for _buffer, sel in reads:
            self.elements.append(sel)
        for _buffer, sel in writes:
            self.elements.append(sel)
        if self.layer >= 2:
            heapq.heappush(self.heap, (end, op, fn, reads, writes))

    def node(self, stream: int, name: str) -> None:
        """A record, a wait or a host sync: timing and a row."""
        if not self.layer:
            return
        source = self._source()
        self.host_ns += 2000
        op = len(self.rows)
        self.rows.append((op, name, stream, source, self.host_ns, self.host_ns))

    def advance(self, until_ns: int) -> None:
        """Run the value events up to ``until_ns`` in (time, op) order."""
        heap = self.heap
        values = self.layer >= 3
        while heap and heap[0][0] <= until_ns:
            _end, _op, fn, reads, writes = heapq.heappop(heap)
            if values:
                out = fn(*[buffer for buffer, _sel in reads])
                if type(out) is not tuple:
                    out = (out,)
                for (buffer, sel), value in zip(writes, out, strict=True):
                    buffer[sel] = value.numpy()


def run_layer(layer: int, n_ops: int, seed: int) -> tuple[int, float, float]:
    """The drawn program on a :class:`StrippedDevice`; returns (ops, wall s, CPU s)."""
    pools, steps = sim_throughput.build_program(n_ops, seed)
    buffers = [np.zeros(4096, dtype=np.int64) for _ in range(4)]
    kernels = [(stream, fn, reads, writes, cost * 1000) for stream, fn, reads, writes, cost
               in sim_throughput.drawn_kernels(pools, steps, [0, 1, 2], buffers)]
    copy_in, copy_out = [(buffers[0], slice(0, 64))], [(buffers[0], slice(64, 128))]

    def copy_fn(value: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(value[:64].copy())

    dev = StrippedDevice(layer)
    gc.freeze()
    t0, c0 = time.perf_counter(), time.process_time()
    issued = kernel_at = 0
    for step in steps:
        kind = step[0]
        if kind == "kernel":
            stream, fn, reads, writes, cost = kernels[kernel_at]
            kernel_at += 1
            dev.launch(stream, "k", fn, reads, writes, cost)
            issued += 1
        elif kind == "wait_stream":
            dev.node(step[2], "record")
            dev.node(step[1], "wait")
            issued += 2
        else:
            dev.node(1, "record")
            dev.node(2, "wait")
            dev.launch(2, "copy", copy_fn, copy_in, copy_out, 5000)
            issued += 3
            if step[1]:
                dev.node(0, "sync")
                dev.advance(dev.host_ns)
                dev.node(0, "host_read")
                issued += 2
            if step[2]:
                dev.node(1, "record")
                dev.node(0, "wait")
                issued += 2
    dev.advance(1 << 62)
    return issued, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sim_throughput.measure(2_000, args.seed)  # imports and the compiled pass: not timed
    print("| device | round | ops | wall s | CPU s | ops/s CPU | us per op |")
    print("|---|---|---|---|---|---|---|")
    for round_no in range(1, args.rounds + 1):
        results = [(name, run_layer(layer, args.ops, args.seed))
                   for layer, name in enumerate(LAYERS)]
        full = sim_throughput.measure(args.ops, args.seed)
        results.append(("SimDevice (sim_throughput.py)", (full.ops, full.wall, full.cpu)))
        for name, (ops, wall, cpu) in results:
            print(f"| {name} | {round_no} | {ops} | {wall:.2f} | {cpu:.2f} | "
                  f"{ops / cpu:,.0f} | {cpu / ops * 1e6:.2f} |")


if __name__ == "__main__":
    main()
