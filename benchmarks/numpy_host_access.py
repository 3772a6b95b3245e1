"""Cost of recording NumPy host accesses of pinned memory (issue 34), in CPU mode.

A vLLM-style host step on pinned buffers' NumPy views (``CpuGpuBuffer.np``): slice
assignment from one pinned array into another and into a plain one, ``np.array`` of a slice,
``np.copyto``, a reduction, a scalar read, and a ``np.array`` of a Python list (the patched
constructor's path for what is not watched). Each row is CPU time (``time.process_time``)
beside wall time, best of ``--repeat`` runs:

- ``plain``: the same step on plain NumPy arrays, no watch;
- ``watched``: the step on ``.numpy()`` of pinned tensors inside ``watch("cpu")``, every
  access recorded and checked by the detector;
- ``unwatched arrays under a watch``: the step on plain arrays while a watch runs (what the
  replaced NumPy constructors and the torch function layer's check cost code that never
  touches pinned memory).

Usage: ``python3 benchmarks/numpy_host_access.py [--steps N] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overlap_harness.recorder import watch  # noqa: E402  (after the repository root is on sys.path)

SIZE = 256
TOKENS = list(range(64))


def host_step(src: np.ndarray, dst: np.ndarray, plain: np.ndarray, n: int) -> int:
    """One step's NumPy host work: 7 reads or writes of ``src``/``dst``."""
    dst[:n] = src[:n]
    plain[:n] = src[:n]
    head = np.array(src[:n])
    np.copyto(dst[n:2 * n], head)
    total = int(src[:n].sum())
    first = int(src[0])
    tokens = np.array(TOKENS, dtype=np.int64)
    return total + first + int(tokens[0])


def run(steps: int, watched: bool, pinned: bool) -> tuple[float, float]:
    """CPU and wall seconds of ``steps`` host steps (the watch's start and end not counted)."""
    def body() -> tuple[float, float]:
        if pinned:
            src = torch.arange(SIZE, dtype=torch.int64, pin_memory=True).numpy()
            dst = torch.zeros(SIZE, dtype=torch.int64, pin_memory=True).numpy()
        else:
            src, dst = np.arange(SIZE, dtype=np.int64), np.zeros(SIZE, dtype=np.int64)
        plain = np.zeros(SIZE, dtype=np.int64)
        cpu, wall = time.process_time(), time.perf_counter()
        for step in range(steps):
            host_step(src, dst, plain, 1 + step % 64)
        return time.process_time() - cpu, time.perf_counter() - wall
    if not watched:
        return body()
    with watch("cpu"):
        return body()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = [("plain", False, False), ("watched", True, True),
            ("unwatched arrays under a watch", True, False)]
    print(f"| {args.steps} host steps | CPU s | wall s | CPU us per step |")
    print("|---|---:|---:|---:|")
    for label, watched, pinned in rows:
        times = [run(args.steps, watched, pinned) for _ in range(args.repeat)]
        cpu, wall = min(t[0] for t in times), min(t[1] for t in times)
        print(f"| {label} | {cpu:.3f} | {wall:.3f} | {cpu / args.steps * 1e6:.0f} |")


if __name__ == "__main__":
    main()
