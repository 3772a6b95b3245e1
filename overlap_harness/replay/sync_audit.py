"""Find every host<->GPU sync nobody asked for in the protocol's launch path.

A forced interleaving only works when issuing an op never waits for the GPU: an op whose
function (or whose staging in :class:`gpu_check.cuda_device.CudaDevice`) synchronizes reads its
inputs at issue time, before the delayed op it should race with has run. PyTorch's sync debug
mode (``torch.cuda.set_sync_debug_mode``) flags every synchronizing call it knows of; the
protocol's own host syncs (``dev.synchronize``, a blocking copy, the harness's ring wraps) run
inside :func:`gpu_check.staging.intended_sync`, which turns the mode off, so what is left is a
bug.

For each run given, one unmeasured warm-up (module loads, the fused gather's compile) and one
run under ``"warn"``; every warning is kept with the Python stack that raised it. The report
groups them by call site (the innermost frames in this repository) and counts them per run,
and gives each run's host launch cost (median gap between consecutive stream ops, µs).

    python -m overlap_harness.replay.sync_audit \
        scenarios/protocol/s03_d2h_waits_publish.toml [more ...]

``--no-staging`` turns :func:`model.staging.staging` off, so the op functions' host
index lists reach the GPU by a plain copy, as ``torch.tensor(list, device="cuda")`` did
before: a check that the audit sees those syncs.

Exit status 0 when no unexpected sync was seen, 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from overlap_harness.gpu_check import cuda_device
from overlap_harness.gpu_check.calibration import calibrate
from overlap_harness.model.protocol import run_protocol
from overlap_harness.replay.plan import with_launch
from overlap_harness.replay.sentinel import SentinelCudaDevice
from overlap_harness.replay.trials import launch_cost_us
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_paths

ROOT = Path(__file__).resolve().parent.parent
SYNC_MESSAGE = "synchronizing CUDA operation"


@dataclass(slots=True)
class Audit:
    """What one run showed: sync call sites (with counts), launch cost, or an error."""

    run_id: str
    sites: Counter = field(default_factory=Counter)
    launch_us: float | None = None
    error: str | None = None


def call_site(stack: Sequence[traceback.FrameSummary], depth: int = 4) -> str:
    """The innermost ``depth`` frames of ``stack`` that lie in this repository, innermost
    first, as ``path:line fn`` joined by `` <- ``."""
    mine = []
    for fr in reversed(stack):
        path = Path(fr.filename)
        if path.is_relative_to(ROOT) and path.name != "sync_audit.py":
            mine.append(f"{path.relative_to(ROOT)}:{fr.lineno} {fr.name}")
        if len(mine) == depth:
            break
    return " <- ".join(mine) or "(outside the repository)"


def audit_one(spec, factory) -> Audit:
    """Warm up, then run ``spec`` once under the sync debug mode's ``"warn"``."""
    out = Audit(spec.run_id)
    sc = with_launch(spec.scenario, spec, None)
    try:
        dev = factory(spec)
        run_protocol(dev, sc)
        dev.finish()
        dev = factory(spec)
        old = warnings.showwarning

        def keep(message, category, filename, lineno, file=None, line=None):
            if SYNC_MESSAGE in str(message):
                out.sites[call_site(traceback.extract_stack()[:-1])] += 1
            else:
                old(message, category, filename, lineno, file, line)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = keep
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run_protocol(dev, sc)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        run = dev.finish()
        out.launch_us = launch_cost_us(run.timeline)
    except Exception as exc:  # a refused run is reported, the audit goes on
        out.error = f"{type(exc).__name__}: {exc}"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Audit the first run (or ``--all`` runs) of each scenario given; print the report."""
    ap = argparse.ArgumentParser(prog="python -m overlap_harness.replay.sync_audit",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="scenario .toml files or folders")
    ap.add_argument("--all", action="store_true", help="every run (mutations too), not the "
                    "first of each scenario")
    ap.add_argument("--no-staging", action="store_true", help="op functions copy host index "
                    "lists with a plain (synchronizing) copy, as before the staging hook")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sync_audit needs a CUDA device", file=sys.stderr)
        return 2
    cal = calibrate()
    if args.no_staging:
        cuda_device.staging = lambda _stage: contextlib.nullcontext()

    def factory(spec):
        return SentinelCudaDevice(spec.removed, calibration=cal)

    specs = []
    for sc in load_paths(args.paths):
        runs = list(expand(sc))
        specs += runs if args.all else runs[:1]
    audits = [audit_one(s, factory) for s in specs]
    total: Counter = Counter()
    for a in audits:
        launch = "-" if a.launch_us is None else f"{a.launch_us:.1f} us"
        print(f"{a.run_id}: {sum(a.sites.values())} unexpected syncs, launch {launch}"
              + (f"  ERROR {a.error[:200]}" if a.error else ""))
        total.update(a.sites)
    print(f"\n{len(total)} call sites, {sum(total.values())} syncs in {len(audits)} runs:")
    for site, n in total.most_common():
        print(f"{n:6d}  {site}")
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
