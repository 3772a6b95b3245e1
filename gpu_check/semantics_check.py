"""Run the semantics traces on a real GPU, with and without PyTorch's CUDA sanitizer.

For every trace of :mod:`gpu_check.traces`: a timed run on :class:`CudaDevice` (our verdict
from the happens-before detector over the measured trace, the values the run observed, and
whether the detector's manifest flag agrees with those values), then a run under CSAN (its
verdict). Prints a table and writes JSON with where and when it ran::

    python3 gpu_check/semantics_check.py --out reports/gpu/semantics.json

Exit status: 0 when every trace gave the expected race kinds and manifest agreed with the
values, 1 otherwise, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from overlap_harness.gpu_check.calibration import Calibration, calibrate
from overlap_harness.gpu_check.cuda_device import CudaDevice
from overlap_harness.gpu_check.sanitizer import run_sanitized
from overlap_harness.gpu_check.traces import TRACES, Outcome, Trace, run_trace, warm_up
from overlap_harness.model.trace import Race


def driver_version() -> str:
    """The NVIDIA driver version nvidia-smi reports ("unknown" without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def race_dict(r: Race) -> dict[str, Any]:
    """A race as JSON: kind, buffer, elements, manifest, both accesses."""
    def side(a: Any) -> dict[str, Any]:
        return {"op": a.op_name, "agent": a.agent, "mode": a.mode, "time_ns": a.time_ns}
    return {"kind": str(r.kind), "buffer": r.buffer, "elements": list(r.elements),
            "manifest": r.manifest, "first": side(r.first), "second": side(r.second)}


def outcome_dict(o: Outcome) -> dict[str, Any]:
    """Our side of one trace: verdict, races, values and their agreement."""
    return {
        "verdict": "race" if o.run.races else "race_free",
        "kinds": list(o.kinds),
        "expected_kinds_ok": o.kinds == o.trace.expect,
        "manifest": o.manifest,
        "values": o.values,
        "values_differ_from_ordered": o.values_differ,
        "manifest_matches_values": o.manifest == o.values_differ,
        "races": [race_dict(r) for r in o.run.races],
        "timeline": [{"op": t.name, "agent": t.agent, "kind": str(t.kind), "issue_ns": t.issue_ns,
                      "start_ns": t.start_ns, "end_ns": t.end_ns} for t in o.run.timeline],
    }


def check_trace(trace: Trace, cal: Calibration) -> dict[str, Any]:
    """One trace's timed run, as a report row (CSAN's verdict is added later)."""
    ours = run_trace(trace, CudaDevice(delays=trace.delays, calibration=cal))
    row: dict[str, Any] = {"name": trace.name, "doc": trace.doc, "expect": list(trace.expect),
                           "ordered": trace.ordered,
                           "delays": {f"{k[0]}@{k[1]}": v for k, v in trace.delays.items()},
                           "ours": outcome_dict(ours)}
    return row


def main(argv: list[str] | None = None) -> int:
    """Run every trace; print the table; write ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--no-sanitizer", action="store_true", help="skip the CSAN runs")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("semantics_check: no CUDA device", file=sys.stderr)
        return 2
    cal = calibrate()
    warm_up(lambda t: CudaDevice(delays=t.delays, calibration=cal))
    rows = [check_trace(t, cal) for t in TRACES]
    if not args.no_sanitizer:  # after the timed runs: CSAN's hooks stay registered
        for t, row in zip(TRACES, rows, strict=True):
            verdict, _ = run_sanitized(
                lambda t=t: run_trace(t, CudaDevice(delays=t.delays, calibration=cal,
                                                    torch_allocator=True)))
            row["csan"] = verdict.as_dict()
    report = {
        "device": torch.cuda.get_device_name(),
        "driver": driver_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "gpu_check/semantics_check.py", *(argv or sys.argv[1:])]),
        "warm_up": "every trace ran once, discarded, before the measured runs",
        "calibration": {"cycles_per_us": cal.cycles_per_us, "overhead_us": cal.overhead_us,
                        "samples": [list(s) for s in cal.samples]},
        "traces": rows,
    }
    print(f"{report['device']}  driver {report['driver']}  torch {report['torch']}  "
          f"{cal.cycles_per_us:.1f} cycles/us")
    print(f"{'trace':24} {'expect':10} {'ours':10} {'manifest':8} {'values ok':9} csan")
    ok = True
    for r in rows:
        o = r["ours"]
        good = o["expected_kinds_ok"] and o["manifest_matches_values"]
        ok &= good
        csan = r.get("csan", {}).get("verdict", "-")
        print(f"{r['name']:24} {','.join(r['expect']) or '-':10} {','.join(o['kinds']) or '-':10} "
              f"{o['manifest']!s:8} {o['manifest_matches_values']!s:9} {csan}"
              f"{'' if good else '   <-- MISMATCH'}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
