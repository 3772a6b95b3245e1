"""Explain a racy run whose GPU values miss the prediction: one gated trial, diffed in full.

    python tools/gpu_diagnose.py scenarios/variants/plan_stream.toml plan.schedule_wait

Prints the plan (delays, gates), every difference between the GPU's values and the
simulator's prediction, and the racing pairs (by op key) that only one of the two traces has:
a pair only the GPU has is one the plan could not gate. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import sys

from overlap_harness.gpu_check.calibration import calibrate
from overlap_harness.model.protocol import run_protocol
from overlap_harness.replay.gates import op_keys
from overlap_harness.replay.plan import Values, diffs, plan_spec
from overlap_harness.replay.sentinel import SentinelCudaDevice
from overlap_harness.runner import simulate
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_paths


def race_keys(run) -> set[tuple]:
    keys = op_keys(run.timeline)
    return {(str(r.kind), r.buffer, keys.get(r.first.op), keys.get(r.second.op))
            for r in run.races}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("mutation")
    ap.add_argument("--launch-us", type=float, default=200.0)
    ap.add_argument("--no-gates", action="store_true")
    a = ap.parse_args(argv)
    (sc,) = load_paths([a.path])
    spec = next(s for s in expand(sc) if (s.mutation_name or "base") == a.mutation)
    plan = plan_spec(spec, host_launch_us=a.launch_us)
    print(f"{spec.run_id}: {plan.kind} {plan.match_class} source={plan.schedule_source}")
    print(f"delays: {plan.delays}")
    print(f"gates ({len(plan.gates)}, dropped {plan.gates_dropped}):")
    for g in plan.gates:
        print(f"  {g[0]} -> {g[1]}")
    cal = calibrate()
    for _ in range(2):  # the first trial loads kernels' modules
        dev = SentinelCudaDevice(spec.removed, delays=plan.delays, calibration=cal,
                                 gates=() if a.no_gates else plan.gates)
        outcome = run_protocol(dev, plan.scenario)
        run = dev.finish()
    got = Values(outcome, dict(dev.observations))
    print(f"gate stats: {dev.gate_stats}")
    lines = diffs(got, plan.predicted.values)
    print(f"{len(lines)} differences from the prediction:")
    for d in lines[:60]:
        print("  " + d.replace(", oracle had ", ", predicted "))
    _o, sdev = simulate(plan.scenario, spec.removed, delays=plan.delays, jitter=0.0)
    srun = sdev.finish()
    g, s = race_keys(run), race_keys(srun)
    print(f"races: gpu {len(g)}, sim {len(s)}")
    for r in sorted(g - s, key=repr)[:30]:
        print(f"  GPU only: {r}")
    for r in sorted(s - g, key=repr)[:30]:
        print(f"  sim only: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
