"""``overlap-harness check [OPTIONS] SCRIPT.py [ARGS...]``: run a real PyTorch script, report its
races.

The script runs unmodified under the recorder (:mod:`recorder`): on a machine without a GPU
with CUDA faked on the CPU, with ``--gpu`` on real streams. Its arguments and environment pass
through. Exit status: 0 no race, 1 races, 2 bad input, a crash of the script (its own
traceback is shown; races found before the crash are still printed), an API the recorder does
not model (one line), or an incomplete verdict: ops of unknown access touched watched memory
(each listed with its line and how to declare it) and ``--allow-unknown-ops`` was not given
(with it, the usual status, and the report lists what was not seen).

Races print once per pair of racing sites, with how many times and in which loop iterations
they raced (:mod:`recorder.report_text`); non-blocking copies of pageable memory print as
``note:`` lines and leave the exit status alone. ``--json FILE`` writes the same as JSON
(:mod:`recorder.report_json`), beside the verdict, whether it is ``complete``, the ops of
unknown access and the refusal, if any; with ``--json -`` stdout carries the JSON document
alone: the script's own output and the report text go to stderr. ``--out DIR`` writes the
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
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from overlap_harness.model.errors import HarnessError
from overlap_harness.output_paths import prepare_outputs

EXIT_OK, EXIT_RACES, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
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


def result_dict(result: Any) -> dict[str, Any]:
    """A :class:`recorder.CheckResult` as JSON (see :mod:`recorder.report_json`)."""
    from overlap_harness.recorder.report_json import notes_json, races_json

    races = races_json(result.races, result.buffer_sites, result.marks)
    unknown = [{"op": u.name, "stream": u.stream, "site": u.site, "tensors": list(u.tensors)}
               for u in result.unknown_ops]
    verdict = "crash" if result.crashed else ("race" if result.races else "race_free")
    if result.refused is not None:
        verdict = "refused"
    return {"script": result.script, "argv": result.argv, "mode": result.mode,
            "verdict": verdict, "complete": result.complete, "races": races,
            "notes": notes_json(result.notes), "unknown_ops": unknown,
            "refused": result.refused, "error": result.error}


def write_reports(result: Any, out: Path, window: tuple[int, int] | None = None,
                  source_root: Path | None = None) -> list[Path]:
    """The timeline plot, Perfetto trace and SARIF of one checked script under ``out``; the
    plot shows iterations ``window`` (first, last) only, the trace and SARIF the whole run.
    ``source_root``: the result names files from there (an engine command's tree), the
    SARIF's ``%SRCROOT%`` (see :func:`overlap_harness.reports.sarif.to_sarif`)."""
    # deferred: matplotlib loads only when reports are asked for
    from overlap_harness.recorder.race_groups import group_races
    from overlap_harness.recorder.report_text import describe_group, marks_lookup
    from overlap_harness.reports.perfetto import write_trace
    from overlap_harness.reports.sarif import write_sarif
    from overlap_harness.reports.timeline import plot_timeline, save_plot
    from overlap_harness.reports.writer import safe_name

    case = result.to_case()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    if case.timeline:
        paths += save_plot(plot_timeline(case, window=window),
                           out / "plots" / safe_name(case.run_id))
    write_trace([case], str(out / "trace.json"))
    groups = group_races(result.races)  # one SARIF result per pair of racing sites
    texts = {id(g.race): describe_group(g, result.buffer_sites, marks_lookup(result.marks))
             for g in groups}
    write_sarif([replace(case, races=[g.race for g in groups])], out / "results.sarif",
                describe=lambda race: texts[id(race)], at_accesses=True,
                source_root=source_root)
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
@contextmanager
def stdout_to_stderr(active: bool) -> Iterator[None]:
    """Inside, everything written to stdout goes to stderr (Python's ``sys.stdout`` and file
    descriptor 1, for output from C code and child processes), when ``active``."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def print_report(result: Any, out: TextIO) -> None:
    """The races (repeats collapsed) and portability notes, as text, to ``out``."""
    from overlap_harness.recorder.report_text import report_lines

    for paragraph in report_lines(result):
        print(paragraph, file=out)


def _write_json(document: dict[str, Any], path: str, to_stdout: bool) -> None:
    """The JSON document to ``path``, or to stdout alone (``--json -``)."""
    text = json.dumps(document, indent=1) + "\n"
    if to_stdout:
        sys.stdout.write(text)
    else:
        Path(path).write_text(text)


def crashed_line(script: str, races: list[Any], mode: str, ops: int) -> str:
    """The verdict line of a script that crashed: no verdict (a race count would read as
    one), how far the run got, and whether the races printed above came before the crash."""
    seen = "; the races above happened before the crash" if races else ""
    return (f"{script}: no verdict, the script crashed ({mode} mode, {ops} ops recorded "
            f"before the crash{seen})")


def run_check(args: argparse.Namespace) -> int:
    """The ``check`` command; see the module docstring for the exit status."""
    # deferred: torch loads only when a script is checked (CLI start-up stays fast)
    from overlap_harness.recorder.api import RecorderError, check_script
    from overlap_harness.recorder.report_text import summary_line

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
    json_to_stdout = args.json == "-"
    text = sys.stderr if json_to_stdout else sys.stdout  # stdout: the JSON document alone
    try:
        with stdout_to_stderr(json_to_stdout):
            result = check_script(args.script, args.args, mode=mode)
    except RecorderError as exc:
        print(f"overlap-harness check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print_report(result, text)
    if result.interrupted:  # Ctrl-C: the races seen so far, the JSON marked partial
        if args.json:
            _write_json(dict(result_dict(result), verdict="interrupted", partial=True),
                        args.json, json_to_stdout)
        if args.out:
            for path in write_reports(result, Path(args.out)):
                print(f"wrote {path}", file=text)
        print(f"{args.script}: no verdict, interrupted ({result.mode} mode, "
              f"{len(result.run.timeline)} ops recorded before Ctrl-C)", file=text)
        print("overlap-harness check: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    unknown_lines = [f"{u.name} on {u.stream} at {u.site or '(no user line)'}, touching "
                     f"{', '.join(u.tensors)}" for u in result.unknown_ops]
    if args.allow_unknown_ops:
        for line in unknown_lines:
            print(f"not seen (--allow-unknown-ops): {line}", file=text)
    if args.json:
        _write_json(result_dict(result), args.json, json_to_stdout)
    if args.out:
        for path in write_reports(result, Path(args.out)):
            print(f"wrote {path}", file=text)
    if result.refused is not None:  # no verdict line: the run was not followed to its end
        print(f"overlap-harness check: {result.refused}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if result.crashed:  # no race count: the run stopped before the script's end
        print(crashed_line(args.script, result.races, result.mode, len(result.run.timeline)),
              file=text)
        print(result.error, file=sys.stderr, end="" if result.error.endswith("\n") else "\n")
        print(f"overlap-harness check: {args.script} crashed", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(summary_line(args.script, result.races, result.notes, result.mode,
                       len(result.run.timeline)), file=text)
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
