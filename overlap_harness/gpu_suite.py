"""``overlap-harness gpu-check``: the whole suite replayed on real CUDA streams.

The wiring of the simulator's plans (:mod:`overlap_harness.gpu_plan`), the replay loop
(:mod:`overlap_harness.gpu_replay`) and ``gpu_check.CudaDevice``:

1. calibrate ``torch.cuda._sleep``, run the first runnable spec twice on the GPU and take the
   host's launch cost from the second run's timeline (the simulations then use it);
2. plan every run in a process pool (spawned workers, no CUDA there) while the GPU replays
   the plans already made, in suite order;
3. with ``--with-torch-sanitizer``, after all timed runs (CSAN's hooks stay registered), one
   run per spec under PyTorch's CUDA sanitizer;
4. write ``<out>/<date>-<device>.json`` and ``.md``.

Exit status: 0 when every race-free run agreed in every trial and every racy run showed the
predicted values in at least 95% of its trials, 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import multiprocessing
import os
import pickle
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from model.errors import HarnessError
from model.protocol import run_protocol
from overlap_harness.gpu_plan import FLOOR_US, MIN_GAP_US, Plan, plan_spec, with_launch
from overlap_harness.gpu_replay import RunReplay, launch_cost_us, replay
from overlap_harness.gpu_report import device_slug, passed, render_markdown, run_row, summarize
from scenarios.expand import RunSpec, expand


class NoCudaError(HarnessError):
    """``gpu-check`` was asked for on a machine without a CUDA device."""


def plan_blob(spec: RunSpec, host_launch_us: float) -> bytes:
    """A plan, pickled in the worker by plain pickle: the tensors travel as bytes, not as
    shared-memory file descriptors (torch's pool pickler runs out of those on a suite)."""
    return pickle.dumps(plan_spec(spec, host_launch_us))


def _one_thread() -> None:
    """Pool initializer: one torch thread a worker. The simulator's tensors are tiny, and 16
    workers of 16 threads each were seen to spin the planning 10x slower on a 16-core host."""
    import torch

    torch.set_num_threads(1)


def cuda_factory(cal: Any) -> Any:
    """A :data:`DeviceFactory` making ``SentinelCudaDevice``s with one calibration."""
    from overlap_harness.gpu_device import SentinelCudaDevice

    def make(plan: Plan, delays: Mapping[tuple[str, int], float]) -> SentinelCudaDevice:
        return SentinelCudaDevice(plan.spec.removed, delays=delays, calibration=cal)

    return make


def measure_launch(specs: Sequence[RunSpec], cal: Any) -> float:
    """The GPU host's launch cost (µs), from the second run of the first spec that runs."""
    from overlap_harness.gpu_device import SentinelCudaDevice

    for spec in specs:
        sc = with_launch(spec.scenario, spec, None)
        try:
            for _ in range(2):  # the first run loads the kernels' modules
                dev = SentinelCudaDevice(spec.removed, calibration=cal)
                run_protocol(dev, sc)
                run = dev.finish()
        except Exception:  # refused or broken on this device: try the next one
            continue
        return launch_cost_us(run.timeline)
    raise HarnessError("no run of the suite completed on the GPU; cannot time a launch")


def sanitize(replays: Sequence[RunReplay], cal: Any) -> None:
    """One run per spec under CSAN; its verdict goes into ``replay.csan``. Plain CudaDevice:
    the sentinel fills are no part of the program, and CSAN would see them as kernels."""
    from gpu_check.device import CudaDevice
    from gpu_check.sanitizer import run_sanitized

    for r in replays:
        def one(r: RunReplay = r) -> None:
            dev = CudaDevice(r.plan.spec.removed, calibration=cal)
            run_protocol(dev, r.plan.scenario)
            dev.finish()

        verdict, _ = run_sanitized(one)
        r.csan = verdict.as_dict()


def environment(cal: Any) -> dict[str, Any]:
    """Where the run happened: device, driver, torch, CUDA, Python, calibration."""
    import torch

    from gpu_check.semantics_check import driver_version

    return {"device": torch.cuda.get_device_name(), "driver": driver_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "calibration": {"cycles_per_us": cal.cycles_per_us, "overhead_us": cal.overhead_us}}


def run_gpu_check(paths: Sequence[str], trials: int = 20, baseline_trials: int | None = None,
                  sanitizer: bool = False, out: Path = Path("reports/gpu"),
                  jobs: int | None = None, host_launch_us: float | None = None,
                  deadline_s: float | None = None, argv: Sequence[str] = ()) -> int:
    """The ``gpu-check`` command (see the module docstring); returns the exit status.

    With ``deadline_s``, no new run starts after that many seconds: the report is written
    with the runs done (and the sanitizer pass is skipped), so a machine lease that ends
    cannot lose everything; the report then says which runs are missing.

    Raises:
        NoCudaError: no CUDA device is available.
        ScenarioError: a scenario file is bad (nothing has run yet).
    """
    import torch

    if not torch.cuda.is_available():
        raise NoCudaError("gpu-check needs a CUDA device; torch.cuda.is_available() is False")
    from gpu_check.calibration import calibrate
    from scenarios.loader import load_paths

    specs = [s for sc in load_paths(paths) for s in expand(sc)]
    t0 = time.perf_counter()
    cal = calibrate()
    if host_launch_us is None:
        host_launch_us = measure_launch(specs, cal)
    print(f"{len(specs)} runs; host launch {host_launch_us:.1f} us; "
          f"{cal.cycles_per_us:.1f} cycles/us", flush=True)
    factory = cuda_factory(cal)
    work = functools.partial(plan_blob, host_launch_us=host_launch_us)
    jobs = jobs or min(16, os.cpu_count() or 1)
    replays: list[RunReplay] = []
    with multiprocessing.get_context("spawn").Pool(jobs, _one_thread) as pool:
        for i, blob in enumerate(pool.imap(work, specs)):
            if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                print(f"deadline: {len(specs) - i} runs not replayed", flush=True)
                sanitizer = False
                break
            plan: Plan = pickle.loads(blob)
            r = replay(plan, factory, trials, baseline_trials)
            replays.append(r)
            print(f"[{i + 1}/{len(specs)} {time.perf_counter() - t0:.0f}s] {plan.spec.run_id} "
                  f"{plan.kind} sim={plan.sim_verdict} gpu={dict(r.main.verdicts)} "
                  f"equal={r.main.equal}/{r.main.trials}"
                  + (f" baseline_wrong={r.baseline.manifest}/{r.baseline.trials}"
                     if r.baseline else "")
                  + (f" ERR {r.main.errors[0][:120]}" if r.main.errors and plan.kind != "error"
                     else ""), flush=True)
    if sanitizer:
        sanitize(replays, cal)
    rows = [run_row(r) for r in replays]
    now = dt.datetime.now(dt.UTC)
    env = environment(cal)
    stem = f"{now.date().isoformat()}-{device_slug(env['device'])}"
    report = {"kind": "gpu-suite", **env, "date": now.isoformat(timespec="seconds"),
              "command": " ".join(["overlap-harness", "gpu-check", *argv]),
              "trials": trials, "baseline_trials": trials if baseline_trials is None
              else baseline_trials, "host_launch_us": host_launch_us, "floor_us": FLOOR_US,
              "min_gap_us": MIN_GAP_US, "seconds": round(time.perf_counter() - t0, 1),
              "json_name": f"{stem}.json", "summary": summarize(rows), "runs": rows,
              "not_replayed": [s.run_id for s in specs[len(replays):]]}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(render_markdown(report), encoding="utf-8")
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {out / stem}.json and .md", file=sys.stderr)
    return 0 if passed(report["summary"]) and not report["not_replayed"] else 1
