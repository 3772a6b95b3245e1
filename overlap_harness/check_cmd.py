"""``overlap-harness check [OPTIONS] SCRIPT.py [ARGS...]``: run a real PyTorch script, report its
races.

The script runs unmodified under the recorder (:mod:`recorder`): on a machine without a GPU
with CUDA faked on the CPU, with ``--gpu`` on real streams. Its arguments and environment pass
through. Exit status: 0 no race, 1 races, 2 bad input, a crash of the script (its own
traceback is shown; races found before the crash are still printed), an API the recorder does
not model (one line), or an incomplete verdict: ops of unknown access touched watched memory
(each listed with its line and how to declare it) and ``--allow-unknown-ops`` was not given
(with it, the usual status, and the report lists what was not seen).

``--json FILE`` writes each race's kind, tensor (with its allocation site), elements and, for
both accesses, file, line, op, stream and mode; beside them the verdict, whether it is
``complete``, the ops of unknown access and the refusal, if any. ``--out DIR`` writes the
timeline plot (``plots/<script>.png|svg``), the Perfetto trace (``trace.json``) and SARIF
(``results.sarif``) that ``run`` writes for scenarios. Both are prepared before the script
runs (:func:`overlap_harness.output_paths.prepare_outputs`).

check's own options go before the script; everything after it is the script's. A token after
the script that is one of check's own options (``--json``, ``--out``, ``--gpu``, ``--cpu``,
``--allow-unknown-ops``) is refused with a hint, since it would reach the script and be
ignored by check; after a ``--`` following the script, every token passes through, colliding
ones included.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from overlap_harness.model.errors import HarnessError
from overlap_harness.output_paths import prepare_outputs

EXIT_OK, EXIT_RACES, EXIT_BAD_INPUT = 0, 1, 2
#: The options of ``check`` itself (each spelling); after the script they are refused.
OWN_OPTIONS = ("--json", "--out", "--gpu", "--cpu", "--allow-unknown-ops")


class CheckUsageError(HarnessError):
    """``check`` was given its arguments in a way it cannot run (one line)."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``check`` on the CLI's subparsers; returns its parser."""
    c = subparsers.add_parser(
        "check", help="run a PyTorch script under the recorder and report its stream races",
        usage=("%(prog)s [-h] [--json FILE|-] [--out DIR] [--gpu|--cpu] [--allow-unknown-ops] "
               "SCRIPT [ARGS...]"),
        description="Run SCRIPT (with ARGS) recording its CUDA streams, events and ops; "
                    "report every race. Exit 0: no race, 1: races, 2: bad input, the "
                    "script crashed, it used an API the recorder does not model, or ops of "
                    "unknown access touched watched memory (see --allow-unknown-ops).")
    c.add_argument("command", nargs=argparse.REMAINDER, metavar="SCRIPT [ARGS]",
                   help="the Python script to run, then its arguments (check's own options go "
                        "before the script; after `SCRIPT --`, every argument is the "
                        "script's)")
    c.add_argument("--json", metavar="FILE", help="write the races as JSON ('-' for stdout)")
    c.add_argument("--out", metavar="DIR", default=None,
                   help="write the timeline plot, Perfetto trace and SARIF under DIR")
    c.add_argument("--allow-unknown-ops", action="store_true",
                   help="accept a verdict that does not see ops of unknown access (raw "
                        "kernels given data_ptr()): exit as usual, listing them as not seen")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--gpu", action="store_true", help="watch real CUDA streams")
    where.add_argument("--cpu", action="store_true",
                       help="fake CUDA on the CPU (the default without a GPU)")
    c.set_defaults(func=run_check)
    return c


def access_dict(access: Any) -> dict[str, Any]:
    """One side of a race as JSON: file, line, op, stream, mode."""
    file, _, line = access.source.rpartition(":")
    return {"file": file if line.isdigit() else access.source,
            "line": int(line) if line.isdigit() else None, "op": access.op_name,
            "stream": access.agent, "mode": access.mode}


def result_dict(result: Any) -> dict[str, Any]:
    """A :class:`recorder.CheckResult` as JSON (see the module docstring)."""
    races = []
    for race in result.races:
        races.append({
            "kind": str(race.kind), "tensor": race.buffer,
            "allocated_at": result.buffer_sites.get(race.buffer),
            "reused_as": race.reused_as, "shape": list(race.shape),
            "elements": list(race.elements), "older": race.older,
            "first": access_dict(race.first), "second": access_dict(race.second)})
    unknown = [{"op": u.name, "stream": u.stream, "site": u.site, "tensors": list(u.tensors)}
               for u in result.unknown_ops]
    verdict = "crash" if result.crashed else ("race" if result.races else "race_free")
    if result.refused is not None:
        verdict = "refused"
    return {"script": result.script, "argv": result.argv, "mode": result.mode,
            "verdict": verdict, "complete": result.complete, "races": races,
            "unknown_ops": unknown, "refused": result.refused, "error": result.error}


def write_reports(result: Any, out: Path) -> list[Path]:
    """The timeline plot, Perfetto trace and SARIF of one checked script under ``out``."""
    # deferred: matplotlib loads only when reports are asked for
    from overlap_harness.reports.perfetto import write_trace
    from overlap_harness.reports.sarif import write_sarif
    from overlap_harness.reports.timeline import plot_timeline, save_plot
    from overlap_harness.reports.writer import safe_name

    case = result.to_case()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if case.timeline:
        paths += save_plot(plot_timeline(case), out / "plots" / safe_name(case.run_id))
    write_trace([case], str(out / "trace.json"))
    write_sarif([case], out / "results.sarif")
    return [*paths, out / "trace.json", out / "results.sarif"]


def split_command(command: list[str]) -> tuple[str, list[str]]:
    """``SCRIPT [ARGS]`` as (script, its arguments).

    Raises:
        CheckUsageError: no script; or one of :data:`OWN_OPTIONS` after the script and before
            any ``--`` (the ``--`` itself is dropped: what follows is the script's).
    """
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CheckUsageError("give the Python script to run: overlap-harness check "
                              "[--json FILE] [--out DIR] [--gpu|--cpu] SCRIPT [ARGS]")
    script, rest = command[0], command[1:]
    for i, token in enumerate(rest):
        if token == "--":
            return script, rest[:i] + rest[i + 1:]
        option = token.split("=", 1)[0]
        if option in OWN_OPTIONS:
            value = " ..." if option in ("--json", "--out") else ""
            raise CheckUsageError(
                f"{option} after the script would go to {script}, not to check: put it "
                f"before the script (overlap-harness check {option}{value} {script}), or "
                f"write {script} -- {option}{value} if the script takes it")
    return script, rest


def run_check(args: argparse.Namespace) -> int:
    """The ``check`` command; see the module docstring for the exit status."""
    # deferred: torch loads only when a script is checked (CLI start-up stays fast)
    from overlap_harness.recorder.api import RecorderError, check_script

    try:
        args.script, args.args = split_command(args.command)
    except CheckUsageError as exc:
        print(f"overlap-harness check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if Path(args.script).is_dir():
        print(f"overlap-harness check: {args.script}: is a directory, not a script; give the "
              "Python file to run", file=sys.stderr)
        return EXIT_BAD_INPUT
    prepare_outputs(files={"--json": args.json}, folders={"--out": args.out})
    mode = "gpu" if args.gpu else ("cpu" if args.cpu else "auto")
    try:
        result = check_script(args.script, args.args, mode=mode)
    except RecorderError as exc:
        print(f"overlap-harness check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for race in result.races:
        print(race.describe())
        site = result.buffer_sites.get(race.buffer)
        if site:
            print(f"  {race.buffer} allocated at {site}")
    unknown_lines = [f"{u.name} on {u.stream} at {u.site or '(no user line)'}, touching "
                     f"{', '.join(u.tensors)}" for u in result.unknown_ops]
    if args.allow_unknown_ops:
        for line in unknown_lines:
            print(f"not seen (--allow-unknown-ops): {line}")
    if args.json:
        text = json.dumps(result_dict(result), indent=1) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
    if args.out:
        for path in write_reports(result, Path(args.out)):
            print(f"wrote {path}")
    if result.refused is not None:  # no verdict line: the run was not followed to its end
        print(f"overlap-harness check: {result.refused}", file=sys.stderr)
        return EXIT_BAD_INPUT
    n = len(result.races)
    print(f"{args.script}: {n} race{'s' if n != 1 else ''} ({result.mode} mode, "
          f"{len(result.run.timeline)} ops recorded)")
    if result.crashed:
        print(result.error, file=sys.stderr, end="" if result.error.endswith("\n") else "\n")
        print(f"overlap-harness check: {args.script} crashed", file=sys.stderr)
        return EXIT_BAD_INPUT
    if unknown_lines and not args.allow_unknown_ops:
        print(f"overlap-harness check: {args.script}: the verdict is incomplete: "
              f"{len(unknown_lines)} op{'s' if len(unknown_lines) != 1 else ''} of unknown "
              "access touched watched memory:", file=sys.stderr)
        for line in unknown_lines:
            print(f"  {line}", file=sys.stderr)
        print("  declare what each reads and writes with "
              "overlap_harness.declare_kernel('module:function', accesses) or "
              "@overlap_harness.declared(accesses), or pass --allow-unknown-ops to accept a "
              "verdict that does not see them", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_RACES if result.races else EXIT_OK
