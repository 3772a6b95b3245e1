"""Random programs in the recorder's GPU mode and CPU mode, on a GPU: their race sets must be
equal (happens-before does not depend on timing). Each difference is shrunk to a 1-minimal
program (no single step can be dropped keeping a difference) and printed.

    python3 tools/recorder_mode_fuzz.py --programs 300 --length 10 [--seed 0] [--out FILE]

Exit status: 0 when every program agreed, 1 when one did not, 2 without CUDA.
The programs: tests/recorder/random_programs.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: make the repository importable
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tests.recorder.random_programs import Step, random_program, run_steps  # noqa: E402


def _verdict(steps: list[Step], mode: str) -> list | str:
    """The race keys, or the error a mode raised (a crash in one mode only is a difference)."""
    try:
        return run_steps(steps, mode)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def differs(steps: list[Step]) -> tuple[bool, list | str, list | str]:
    """Whether the two modes disagree on ``steps``, with both verdicts."""
    cpu, gpu = _verdict(steps, "cpu"), _verdict(steps, "gpu")
    return cpu != gpu, cpu, gpu


def shrink(steps: list[Step]) -> list[Step]:
    """Drop steps one at a time while the modes still disagree (1-minimal)."""
    changed = True
    while changed:
        changed = False
        for index in range(len(steps)):
            trial = steps[:index] + steps[index + 1:]
            if differs(trial)[0]:
                steps, changed = trial, True
                break
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=300)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the differences as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("recorder_mode_fuzz: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    started, found = time.perf_counter(), []
    for seed in range(args.seed, args.seed + args.programs):
        steps = random_program(seed, args.length)
        different, _, _ = differs(steps)
        if not different:
            continue
        small = shrink(steps)
        _, cpu, gpu = differs(small)
        found.append({"seed": seed, "steps": [str(s) for s in small], "cpu": cpu, "gpu": gpu})
        print(json.dumps(found[-1]), flush=True)
    summary = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "command": "python3 tools/recorder_mode_fuzz.py " + " ".join(sys.argv[1:]),
               "programs": args.programs, "length": args.length, "first_seed": args.seed,
               "differences": len(found), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "seconds": round(time.perf_counter() - started, 1)}
    print(json.dumps(summary), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "differences": found}, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if found else 0)  # GPU mode's trace hooks stay on: leave without teardown


if __name__ == "__main__":
    sys.exit(main())
