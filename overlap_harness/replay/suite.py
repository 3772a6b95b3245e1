"""``overlap-harness gpu-check``: the whole suite replayed on real CUDA streams.

The wiring of the simulator's plans (:mod:`overlap_harness.replay.plan`), the replay loop
(:mod:`overlap_harness.replay.trials`) and ``gpu_check.CudaDevice``:

1. calibrate ``torch.cuda._sleep``, run the first runnable spec twice on the GPU and take the
   host's launch cost from the second run's timeline (the simulations then use it);
2. plan every run in a process pool (spawned workers, no CUDA there) while the GPU replays
   the plans already made, in suite order;
3. write ``<out>/<date>-<device>.json`` and ``.md`` after every replayed run, so a lease that
   ends mid-way still leaves the runs done;
4. with ``--with-torch-sanitizer``, afterwards, PyTorch's CUDA sanitizer on the base run and
   the first racy mutation of each scenario (:func:`sanitize`), in a worker process of its own
   (CSAN's hooks stay registered in the process that ran it, and a run that hangs under it is
   killed there): ``SANITIZER_RUN_S`` a run (twice, the second time in a new worker),
   ``SANITIZER_BUDGET_S`` in all (``--sanitizer-budget``), and the runs left when either is
   spent say ``"not run (time)"``; then the report is written again.

Exit status: 0 when every race-free run whose values are compared agreed in every trial and
every racy run reached 95% of its trials under its class (exact: the predicted values;
manifest-only: wrong values at the predicted places), 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import contextlib
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

import torch

from overlap_harness.gpu_check.calibration import calibrate
from overlap_harness.gpu_check.cuda_device import CudaDevice
from overlap_harness.gpu_check.sanitizer import run_sanitized
from overlap_harness.gpu_check.semantics_check import driver_version
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.opkeys import Gate
from overlap_harness.model.protocol import run_protocol
from overlap_harness.replay.limits import (
    SANITIZER_AFTER_DEADLINE_S,
    SANITIZER_BUDGET_S,
    SANITIZER_RUN_S,
    SANITIZER_START_S,
)
from overlap_harness.replay.plan import (
    FLOOR_US,
    GAP_DRIFT_SHARE,
    GAP_FLOOR_US,
    GAP_ITER_SHARE,
    Plan,
    plan_spec,
    with_launch,
)
from overlap_harness.replay.report import device_slug, passed, render_markdown, run_row, summarize
from overlap_harness.replay.sentinel import SentinelCudaDevice
from overlap_harness.replay.trials import RunReplay, launch_cost_us, replay
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths

NOT_RUN_TIME = "not run (time)"


class NoCudaError(HarnessError):
    """``gpu-check`` was asked for on a machine without a CUDA device."""


def plan_blob(spec: RunSpec, host_launch_us: float) -> bytes:
    """A plan, pickled in the worker by plain pickle: the tensors travel as bytes, not as
    shared-memory file descriptors (torch's pool pickler runs out of those on a suite)."""
    return pickle.dumps(plan_spec(spec, host_launch_us))


def _one_thread() -> None:
    """Pool initializer: one torch thread a worker. The simulator's tensors are tiny, and 16
    workers of 16 threads each were seen to spin the planning 10x slower on a 16-core host."""
    torch.set_num_threads(1)


def cuda_factory(cal: Any) -> Any:
    """A :data:`DeviceFactory` making ``SentinelCudaDevice``s with one calibration."""
    def make(plan: Plan, delays: Mapping[tuple[str, int], float],
             gates: Sequence[Gate] = ()) -> SentinelCudaDevice:
        return SentinelCudaDevice(plan.spec.removed, delays=delays, calibration=cal,
                                  gates=gates)

    return make


def measure_launch(specs: Sequence[RunSpec], cal: Any) -> float:
    """The GPU host's launch cost (µs), from the second run of the first spec that runs."""
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


def _csan_worker(conn: Any, cal: Any) -> None:
    """The sanitizer's process: answers each pickled plan it receives with CSAN's verdict on
    one run of it (plain CudaDevice: the sentinel fills are no part of the program, and CSAN
    would see them as kernels; on torch's allocator, whose allocations CSAN follows, where
    the harness's block pool would hide a reuse from it); an empty message ends it."""
    torch.cuda.init()
    conn.send("ready")
    while blob := conn.recv_bytes():
        plan: Plan = pickle.loads(blob)

        def one(plan: Plan = plan) -> None:
            dev = CudaDevice(plan.spec.removed, calibration=cal, torch_allocator=True)
            run_protocol(dev, plan.scenario)
            dev.finish()

        verdict, _ = run_sanitized(one)
        conn.send(verdict.as_dict())


class _CsanProcess:
    """A started :func:`_csan_worker` and its pipe; ``ask`` waits for one verdict, at most
    ``limit_s``, and ``None`` means it did not come (the caller then stops the process)."""

    def __init__(self, cal: Any, start_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_csan_worker, args=(child, cal), daemon=True)
        self.proc.start()
        child.close()
        self.ready = self.conn.poll(start_s) and self.conn.recv() == "ready"

    def ask(self, plan: Plan, limit_s: float) -> dict[str, Any] | None:
        self.conn.send_bytes(pickle.dumps(plan))
        if not self.conn.poll(limit_s):
            return None
        return self.conn.recv()

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send_bytes(b"")
            self.proc.join(2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def csan_selection(replays: Sequence[RunReplay]) -> list[RunReplay]:
    """The runs the sanitizer checks: each scenario's base run and its first racy mutation
    (runs the harness refuses are left out: there is nothing to check)."""
    out, racy_seen = [], set()
    for r in replays:
        p = r.plan
        if p.kind == "error":
            continue
        name = p.spec.scenario.name
        if (p.spec.mutation_name or "base") == "base":
            out.append(r)
        elif p.kind == "racy" and name not in racy_seen:
            racy_seen.add(name)
            out.append(r)
    return out


def _not_run(why: str) -> dict[str, Any]:
    return {"verdict": why, "flagged": False, "errors": [], "failure": None}


def sanitize(replays: Sequence[RunReplay], cal: Any, budget_s: float = SANITIZER_BUDGET_S,
             run_s: float = SANITIZER_RUN_S, start_s: float = SANITIZER_START_S,
             after_each: Any = None) -> None:
    """CSAN's verdict on :func:`csan_selection`'s runs, into ``replay.csan``, in a worker
    process. A run over ``run_s`` kills the worker and is tried once more in a new one (a
    worker that has checked many runs was seen to take over ``run_s`` on a run a new one
    checks in 4 s); a second time out is its verdict, ``"not run (time)"``. The runs left
    once ``budget_s`` is spent are not run. ``after_each`` (no arguments) is called after
    every verdict."""
    t0 = time.perf_counter()
    worker: _CsanProcess | None = None
    try:
        for r in csan_selection(replays):
            got = None
            for _attempt in range(2):
                left = budget_s - (time.perf_counter() - t0)
                if left <= 0:
                    break
                if worker is None:
                    worker = _CsanProcess(cal, min(start_s, left))
                    if not worker.ready:
                        worker.stop()
                        worker = None
                        break
                try:
                    got = worker.ask(r.plan, min(run_s, max(left, 0.1)))
                except (EOFError, OSError) as exc:  # the worker died under this run
                    got = {**_not_run("error"), "failure": f"sanitizer worker died: {exc!r}"}
                    worker.stop()
                    worker = None
                    break
                if got is not None:
                    break
                worker.stop()  # over run_s
                worker = None
            if got is None:
                got = {**_not_run(NOT_RUN_TIME), "failure": f"over {run_s:.0f} s, or no time"}
            r.csan = got
            print(f"csan {r.plan.spec.run_id}: {got['verdict']}", flush=True)
            if after_each is not None:
                after_each()
    finally:
        if worker is not None:
            worker.stop()


def environment(cal: Any) -> dict[str, Any]:
    """Where the run happened: device, driver, torch, CUDA, Python, calibration."""
    return {"device": torch.cuda.get_device_name(), "driver": driver_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "calibration": {"cycles_per_us": cal.cycles_per_us, "overhead_us": cal.overhead_us}}


def run_gpu_check(paths: Sequence[str], trials: int = 20, baseline_trials: int | None = None,
                  sanitizer: bool = False, out: Path = Path("reports/gpu"),
                  jobs: int | None = None, host_launch_us: float | None = None,
                  deadline_s: float | None = None, argv: Sequence[str] = (),
                  gated: bool = True, sanitizer_budget_s: float = SANITIZER_BUDGET_S) -> int:
    """The ``gpu-check`` command (see the module docstring); returns the exit status.

    With ``deadline_s``, no new run starts after that many seconds: the report is written
    with the runs done (and the sanitizer pass is skipped), so a machine lease that ends
    cannot lose everything; the report then says which runs are missing. The sanitizer pass
    takes at most ``sanitizer_budget_s`` (the runs it leaves are reported "not run (time)").

    Raises:
        NoCudaError: no CUDA device is available.
        ScenarioError: a scenario file is bad (nothing has run yet).
    """
    if not torch.cuda.is_available():
        raise NoCudaError("gpu-check needs a CUDA device; torch.cuda.is_available() is False")
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
    env = environment(cal)
    now = dt.datetime.now(dt.UTC)
    stem = f"{now.date().isoformat()}-{device_slug(env['device'])}"
    head = {"kind": "gpu-suite", **env, "date": now.isoformat(timespec="seconds"),
            "command": " ".join(["overlap-harness", "gpu-check", *argv]),
            "trials": trials, "baseline_trials": trials if baseline_trials is None
            else baseline_trials, "host_launch_us": host_launch_us, "floor_us": FLOOR_US,
            "min_gap_us": GAP_FLOOR_US,
            "gap_rule": f"max({GAP_FLOOR_US:.0f} µs, {GAP_ITER_SHARE:g} × the simulated "
                        f"iteration, {GAP_DRIFT_SHARE:g} × the host time between the two "
                        "accesses' issue), for the racing pairs the schedule inverts only",
            "gated": gated, "json_name": f"{stem}.json"}
    out.mkdir(parents=True, exist_ok=True)

    def write(stage: str) -> dict[str, Any]:
        rows = [run_row(r) for r in replays]
        report = {**head, "stage": stage, "seconds": round(time.perf_counter() - t0, 1),
                  "summary": summarize(rows), "runs": rows,
                  "not_replayed": [s.run_id for s in specs[len(replays):]]}
        (out / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n",
                                          encoding="utf-8")
        (out / f"{stem}.md").write_text(render_markdown(report), encoding="utf-8")
        return report

    with multiprocessing.get_context("spawn").Pool(jobs, _one_thread) as pool:
        for i, blob in enumerate(pool.imap(work, specs)):
            if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
                print(f"deadline: {len(specs) - i} runs not replayed", flush=True)
                break
            plan: Plan = pickle.loads(blob)
            r = replay(plan, factory, trials, baseline_trials, gated=gated)
            replays.append(r)
            spent = time.perf_counter() - t0  # and the time left at this pace (issue 19)
            print(f"[{i + 1}/{len(specs)} {spent:.0f}s, ETA "
                  f"{spent * (len(specs) - i - 1) / (i + 1):.0f}s] {plan.spec.run_id} "
                  f"{plan.kind} sim={plan.sim_verdict} gpu={dict(r.main.verdicts)} "
                  f"equal={r.main.equal}/{r.main.trials}"
                  + (f" {plan.match_class} hits={r.hits}/{r.main.trials}"
                     if plan.kind == "racy" else "")
                  + (f" baseline_wrong={r.baseline.manifest}/{r.baseline.trials}"
                     if r.baseline else "")
                  + (f" values={plan.values_class}" if plan.kind == "race_free"
                     and not r.compared else "")
                  + (f" ERR {r.main.errors[0][:120]}" if r.main.errors and plan.kind != "error"
                     else ""), flush=True)
            write("replaying")
    report = write("replayed")
    if sanitizer:
        budget = sanitizer_budget_s
        if deadline_s is not None:
            budget = min(budget, deadline_s + SANITIZER_AFTER_DEADLINE_S
                         - (time.perf_counter() - t0))
        sanitize(replays, cal, budget, after_each=lambda: write("sanitizing"))
        report = write("done")
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {out / stem}.json and .md", file=sys.stderr)
    return 0 if passed(report["summary"]) and not report["not_replayed"] else 1
