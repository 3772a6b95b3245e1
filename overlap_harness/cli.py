"""The command line: ``overlap-harness run PATH...`` and friends.

Exit status (also in ``--help`` and the README): 0 every verdict as expected; 1 a verdict
differs; 2 bad input or usage (one line per problem on stderr, no traceback), found before
anything runs wherever it can be; 3 an internal error (our bug, so the traceback is shown);
130 interrupted (Ctrl-C), one line.

Streams: tables go to stdout, progress and notes to stderr; with ``--json -`` stdout carries
the JSON document alone and the table moves to stderr, so the output pipes into ``jq``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from overlap_harness import __version__, calibrate_cmd, check_cmd
from overlap_harness.cli_options import OneLineParser, count, seconds
from overlap_harness.conformance import cli as conformance_cli
from overlap_harness.engines.sglang import cli as sglang_loop_cli
from overlap_harness.engines.tokenspeed import cli as tokenspeed_cli
from overlap_harness.engines.vllm import cli as vllm_cli
from overlap_harness.model.errors import HarnessError, ScenarioError
from overlap_harness.output_paths import prepare_outputs, safe_name
from overlap_harness.replay.limits import SANITIZER_BUDGET_S
from overlap_harness.reports import DEFAULT_OUT, tables

if TYPE_CHECKING:  # for a type hint only: the command line starts without the writers
    from overlap_harness.reports.plot_jobs import PlotJobs

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

EXIT_CODES = """exit status:
  0    every verdict as expected
  1    a verdict differs from its expect (or explore left a race not manifest)
  2    bad input or usage: one line per problem, file: key: reason
  3    internal error: a bug in overlap-harness; the traceback is printed
  130  interrupted (Ctrl-C)"""


class UsageError(HarnessError):
    """A command-line value that cannot work (an output folder that is a file, ...)."""


class _Progress:
    """Progress on stderr.

    On a terminal, one line redrawn in place: the run (``i/n`` and its id) and, inside a run,
    the work done of the run (iterations, or trials for explore), device ops per second and
    the time the run has left at the current rate. Elsewhere (CI logs) a line per 10% of the
    runs and nothing inside them, so logs stay short.
    """

    def __init__(self, enabled: bool, unit: str = "it") -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.unit = unit
        self.last_tenth = -1
        self.run_text = ""
        self.started = time.perf_counter()
        self.drawn = 0.0
        self.ops = 0
        self.device_ops = 0

    def __call__(self, i: int, n: int, what: str) -> None:
        """Run ``i`` of ``n`` (``what``) starts; ``i == n`` ends the line."""
        if not self.enabled or n == 0:
            return
        if self.tty:
            bar = "#" * (30 * i // n)
            self.run_text = f"[{bar:<30}] {i}/{n} {what[:40]}"
            self.started, self.ops, self.device_ops = time.perf_counter(), 0, 0
            self._draw(self.run_text, end="\n" if i == n else "")
        elif (tenth := 10 * i // n) != self.last_tenth:
            self.last_tenth = tenth
            sys.stderr.write(f"[{i}/{n}] {what}\n")

    def watch(self, done: int, total: int, ops: int | None = None) -> None:
        """Inside the current run: ``done`` of ``total`` units, ``ops`` device ops issued by
        the current device (a new device starts again from 0)."""
        if not self.tty:
            return
        now = time.perf_counter()
        if ops is not None:
            self.ops += ops - self.device_ops if ops >= self.device_ops else ops
            self.device_ops = ops
        if now - self.drawn < 0.25 and done < total:
            return
        elapsed = max(now - self.started, 1e-9)
        parts = [f"{done}/{total} {self.unit}"]
        if ops is not None:
            parts.append(f"{self.ops / elapsed:,.0f} ops/s")
        if 0 < done < total:
            parts.append(f"ETA {_duration(elapsed * (total - done) / done)}")
        self._draw(f"{self.run_text}  " + "  ".join(parts))

    def _draw(self, text: str, end: str = "") -> None:
        width = max(20, shutil.get_terminal_size().columns - 1)
        sys.stderr.write("\r" + text[:width].ljust(width) + end)
        sys.stderr.flush()
        self.drawn = time.perf_counter()


def _duration(seconds: float) -> str:
    """``42s``, ``3m05s`` or ``2h10m``."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f}"


def results_table(results) -> str:
    """The results table, 120 columns wide (:func:`reports.tables.results_table`)."""
    return tables.results_table(results)


# -- checks made before anything runs ---------------------------------------------------------

def _check_memory(scenarios: Sequence[Any], override: bool) -> None:
    """Refuse (UsageError) a scenario whose largest run would not fit in this machine's
    memory, by :func:`overlap_harness.runner.estimate_run_bytes`; ``override`` only warns."""
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.runner import available_memory_bytes, estimate_run_bytes

    have = available_memory_bytes()
    if have is None:
        return
    for sc in scenarios:
        need = estimate_run_bytes(sc)
        if need <= have:
            continue
        line = (f"{sc.path}: estimated peak memory {need / 2**30:.1f} GiB for one run "
                f"(workload.iterations = {sc.workload.iterations}, protocol.max_context = "
                f"{sc.protocol.max_context}, protocol.pool_size = {sc.protocol.pool_size}) "
                f"exceeds the {have / 2**30:.1f} GiB available")
        if not override:
            raise UsageError(line + "; make the workload smaller, or pass "
                                    "--ignore-memory-estimate to run it anyway")
        print(f"overlap-harness: warning: {line}; running anyway", file=sys.stderr)


def _human(args: argparse.Namespace) -> TextIO:
    """Where tables and notes go: stdout, unless stdout carries the JSON (``--json -``)."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


# -- the commands ---------------------------------------------------------------------------

@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the modules of a run load, and what they made
    frozen after (out of every later collection; :func:`gc.freeze`). Importing torch makes
    some 250,000 objects that live as long as the process and no garbage: collections during
    it cost about 0.15 CPU s, before anything can run."""
    from overlap_harness.model.node_rows import collector_paused  # deferred: numpy

    with collector_paused():
        try:
            yield
        finally:
            gc.freeze()  # before the collector is back on


def _cmd_run(args: argparse.Namespace) -> int:
    with _collector_paused():
        # deferred: imports torch; the command line starts (and fails on bad input) without it
        from overlap_harness.scenarios.loader import load_paths

    human = _human(args)
    prepare_outputs(files={"--json": args.json, "--junit": args.junit},
                    folders={"--out": None if args.no_reports else args.out})
    plots = None
    if not args.no_reports:
        # deferred: the plot workers, only when reports are written; forked once the output
        # folder is prepared, before the scenarios load (they import matplotlib meanwhile), to
        # draw while the runs simulate
        from overlap_harness.reports.plot_jobs import start_plots

        plots = start_plots(Path(args.out) / "plots")
    try:
        scenarios = load_paths(args.paths, runnable=True)  # bad input stops here
        scenarios = [calibrate_cmd.apply_profile(sc, args.profile) for sc in scenarios]
        _check_memory(scenarios, args.ignore_memory_estimate)
        return _run_and_report(args, scenarios, plots, human)
    finally:
        if plots is not None:
            plots.close()


def _run_and_report(args: argparse.Namespace, scenarios: Sequence[Any],
                    plots: PlotJobs | None, human: TextIO) -> int:
    """The runs of ``run``/``report`` and what they print and write (``plots``: the started
    plot workers, None with ``--no-reports``)."""
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.engines.core.interrupted import Interrupted
    from overlap_harness.reports.jsonout import to_json
    from overlap_harness.reports.junit import write_junit
    from overlap_harness.runner import UNUSED_SYNC, failure_report, run_scenarios

    progress = _Progress(not args.quiet)
    # without reports nothing reads a timeline (tables, --json, JUnit): runs send none back
    try:
        results = run_scenarios(scenarios, progress=progress, watch=progress.watch,
                                on_result=None if plots is None else plots.offer,
                                jobs=_run_jobs(args), timelines=plots is not None)
    except Interrupted as stop:  # Ctrl-C: the runs that finished, written marked partial
        if args.json and args.json != "-":
            Path(args.json).write_text(to_json(stop.finished, partial=True))
        elif args.json:
            sys.stdout.write(to_json(stop.finished, partial=True))
        print(f"\noverlap-harness: interrupted after {len(stop.finished)} runs"
              f"{'; --json written with partial: true' if args.json else ''}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(results_table(results), file=human)
    for r in results:
        if not r.ok:
            print("\n" + failure_report(r), file=human)
    if args.json:
        text = to_json(results)
        if args.json == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            Path(args.json).write_text(text)
    if args.junit:
        write_junit(results, args.junit)
    rows = _print_necessity(scenarios, human) if args.necessity else []
    if plots is not None:
        # deferred: the report writers (imported already by _cmd_run when reports are on)
        from overlap_harness.reports.writer import write_all

        path = write_all(results, args.out, rows, progress=_Progress(not args.quiet),
                         plots=plots)
        print(f"\nreports: {path}", file=human)
    failed = sum(not r.ok for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed", file=human)
    unused = [line for r in results if r.error and UNUSED_SYNC in r.error
              for line in r.error.splitlines()]
    if unused:  # a scenario problem only running could find: bad input, said last
        print("\n".join(unused), file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_MISMATCH if failed else EXIT_OK


def _run_jobs(args: argparse.Namespace) -> int:
    """Processes for the runs: ``-j N``, else one per CPU (at most 8). On a machine that
    others keep busy, ``-j 1`` is cheaper: more processes then only add the cost of forking
    and of sending results back (about a tenth more CPU, measured on 2 shared cores)."""
    if getattr(args, "jobs", None) is not None:
        return args.jobs
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return min(8, len(cpus) if cpus else os.cpu_count() or 1)


def _print_necessity(scenarios, human: TextIO) -> list[list[str]]:
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.necessity import necessity, race_free_base

    rows = []
    for sc in scenarios:
        if not race_free_base(sc):
            continue
        for row in necessity(sc):
            rows.append([row.scenario, row.label, "necessary" if row.necessary else "redundant",
                         ", ".join(row.races) or "-", "yes" if row.manifest else "no",
                         _us(row.stall_saved_ns), _us(row.idle_saved_ns)])
    print("\nSync necessity (each label removed alone)", file=human)
    print(tables.necessity_table(rows), file=human)
    return rows


def _cmd_report(args: argparse.Namespace) -> int:
    args.necessity, args.no_reports, args.json, args.junit = True, False, None, None
    return _cmd_run(args)


def _cmd_plot(args: argparse.Namespace) -> int:
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.reports.timeline import plot_timeline, save_plot
    from overlap_harness.runner import run_spec
    from overlap_harness.scenarios.expand import expand
    from overlap_harness.scenarios.loader import load_scenario

    if args.out:
        prepare_outputs(files={"--out": args.out + ".png"})
    scenario = load_scenario(args.scenario, runnable=True)
    specs = expand(scenario)
    names = [s.mutation_name or "base" for s in specs]
    if (args.mutation or "base") not in names:
        raise UsageError(f"{args.scenario}: no mutation {args.mutation!r}; runs are "
                         + "|".join(names))
    spec = specs[names.index(args.mutation or "base")]
    window = None
    if args.window:
        a, _, b = args.window.partition(":")
        if not (a.isdigit() and b.isdigit() and int(a) <= int(b)):
            raise UsageError(f"--window: expected A:B with A <= B, got {args.window!r}")
        window = (int(a), int(b))
    stem = args.out
    if not stem:
        stem = f"{DEFAULT_OUT}/plots/{safe_name(spec.run_id)}"
        prepare_outputs(files={"--out (default)": stem + ".png"})
    _check_memory([scenario], args.ignore_memory_estimate)
    progress = _Progress(True)
    result = run_spec(spec, watch=progress.watch)
    if progress.tty:
        sys.stderr.write("\n")
    paths = save_plot(plot_timeline(result, window=window), stem)
    print("\n".join(str(p) for p in paths))
    return EXIT_OK


def _cmd_whatif(args: argparse.Namespace) -> int:
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.scenarios.loader import load_scenario
    from overlap_harness.whatif import HEAD, VARIANTS, format_rows, whatif

    sc = calibrate_cmd.apply_profile(load_scenario(args.scenario, runnable=True), args.profile)
    _check_memory([sc], args.ignore_memory_estimate)
    progress = _Progress(not args.quiet)
    protocol = {f.name: getattr(sc.protocol, f.name) for f in dataclasses.fields(sc.protocol)}
    chosen = tables.variants_for_mode(VARIANTS, str(sc.protocol.mode), protocol)
    rows = whatif(sc, dict(chosen), progress=progress, watch=progress.watch)
    print(f"What-if on {sc.name} ({sc.workload.iterations} iterations)")
    print(_table(format_rows(rows), HEAD))
    print("\nVariants:\n" + tables.whatif_legend(r.variant for r in rows))
    return EXIT_OK


def _cmd_explore(args: argparse.Namespace) -> int:
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.runner import explore_specs
    from overlap_harness.scenarios.loader import load_paths

    scenarios = load_paths(args.paths, runnable=True)
    _check_memory(scenarios, args.ignore_memory_estimate)
    progress = _Progress(not args.quiet, unit="trials")
    rows, failed = explore_specs(scenarios, budget=args.explore,
                                 time_limit_s=args.time_limit, progress=progress,
                                 jobs=args.jobs, watch=progress.watch)
    print(_table(rows, ["run", "races", "manifest", "source", "tried", "shrunk delays"]))
    print(f"\n{len(rows) - failed} manifest, {failed} not made manifest")
    return EXIT_MISMATCH if failed else EXIT_OK


def _cmd_gpu_check(args: argparse.Namespace) -> int:
    # deferred: imports torch; the command line starts (and fails on bad input) without it
    from overlap_harness.replay.suite import run_gpu_check
    from overlap_harness.scenarios.loader import load_paths

    prepare_outputs(folders={"--out": args.out})
    _check_memory(load_paths(args.paths, runnable=True), args.ignore_memory_estimate)
    argv = [*args.paths, "--trials", str(args.trials), "--out", args.out]
    if args.baseline_trials is not None:
        argv += ["--baseline-trials", str(args.baseline_trials)]
    if args.with_torch_sanitizer:
        argv.append("--with-torch-sanitizer")
    if args.no_gates:
        argv.append("--no-gates")
    if args.deadline is not None:
        argv += ["--deadline", f"{args.deadline:g}"]
    if args.sanitizer_budget != SANITIZER_BUDGET_S:
        argv += ["--sanitizer-budget", f"{args.sanitizer_budget:g}"]
    status = run_gpu_check(args.paths, trials=args.trials,
                           baseline_trials=args.baseline_trials,
                           sanitizer=args.with_torch_sanitizer, out=Path(args.out),
                           jobs=args.jobs, deadline_s=args.deadline, argv=argv,
                           gated=not args.no_gates, sanitizer_budget_s=args.sanitizer_budget)
    if args.profile:  # the timing replay, predicted with the profile (docs/calibration.md)
        from overlap_harness.timing_check import timing_report  # deferred: the simulator

        status = max(status, timing_report(args.paths, args.profile, args.out))
    return status


# -- the parser -----------------------------------------------------------------------------

SubParsers = Any  # argparse's _SubParsersAction, which has no public name


def _command(sub: SubParsers, name: str, help_text: str) -> argparse.ArgumentParser:
    """A subcommand parser that shows the exit codes under its ``--help``."""
    return sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _jobs_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-j", "--jobs", type=count(1), default=None, metavar="N",
                        help="run the scenarios in N processes (default: one per CPU, at "
                             "most 8; 1: in this process, with progress inside each run, "
                             "and the least CPU on a busy machine)")


def _memory_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ignore-memory-estimate", action="store_true",
                        help="run a scenario even when its estimated peak memory exceeds "
                             "the memory available (refused by default)")


def _add_run(sub: SubParsers) -> None:
    r = _command(sub, "run", "run scenario files or folders on the simulated device")
    r.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    calibrate_cmd.add_profile_argument(r)
    r.add_argument("--json", metavar="FILE", help="write results as JSON ('-' for stdout: "
                   "then stdout holds the JSON alone and the table goes to stderr)")
    r.add_argument("--junit", metavar="FILE", help="write JUnit XML, one case per run")
    r.add_argument("--necessity", action="store_true",
                   help="remove each sync of each race-free scenario in turn; print which "
                        "are necessary")
    r.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help="folder for the reports: summary.html/.md, plots, trace.json, "
                        f"junit.xml, results.sarif, results.json (default ./{DEFAULT_OUT})")
    r.add_argument("--no-reports", action="store_true", help="print the table only")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _jobs_flag(r)
    _memory_flag(r)
    r.set_defaults(func=_cmd_run)


def _add_report(sub: SubParsers) -> None:
    rp = _command(sub, "report", "run scenarios and write every report, with the necessity "
                                 "table")
    rp.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    calibrate_cmd.add_profile_argument(rp)
    rp.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                    help=f"output folder (default ./{DEFAULT_OUT})")
    rp.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _jobs_flag(rp)
    _memory_flag(rp)
    rp.set_defaults(func=_cmd_report)


def _add_plot(sub: SubParsers) -> None:
    pl = _command(sub, "plot", "draw the timeline of one run of one scenario")
    pl.add_argument("scenario", help="a scenario .toml file")
    pl.add_argument("--mutation", default="", help="mutation name (default: the base run)")
    pl.add_argument("--window", default=None, metavar="A:B", help="zoom to iterations A..B")
    pl.add_argument("--out", default=None, metavar="FILE",
                    help="output path without extension (writes .png and .svg)")
    _memory_flag(pl)
    pl.set_defaults(func=_cmd_plot)


def _add_whatif(sub: SubParsers) -> None:
    w = _command(sub, "whatif", "run the protocol variants side by side on one scenario")
    w.add_argument("scenario", help="a scenario .toml file")
    calibrate_cmd.add_profile_argument(w)
    w.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _memory_flag(w)
    w.set_defaults(func=_cmd_whatif)


def _add_explore(sub: SubParsers) -> None:
    e = _command(sub, "explore", "find and shrink a manifest schedule for every racy run")
    e.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    e.add_argument("--explore", type=count(1), default=64, metavar="N",
                   help="schedules to try per racy run (default 64)")
    e.add_argument("--time-limit", type=seconds, default=None, metavar="S",
                   help="seconds per racy run")
    e.add_argument("-j", "--jobs", type=count(1), default=1, metavar="N",
                   help="explore runs in N processes (multiprocessing pool)")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress")
    _memory_flag(e)
    e.set_defaults(func=_cmd_explore)


def _add_gpu_check(sub: SubParsers) -> None:
    g = _command(sub, "gpu-check", "replay every run on real CUDA streams against the "
                                   "simulator; write reports/gpu/<date>-<device>.json and .md")
    g.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    g.add_argument("--trials", type=count(1), default=20, metavar="N",
                   help="trials per schedule (default 20)")
    g.add_argument("--baseline-trials", type=count(0), default=None, metavar="N",
                   help="no-delay trials of each racy run (default: --trials)")
    g.add_argument("--with-torch-sanitizer", action="store_true",
                   help="also run each spec once under PyTorch's CUDA sanitizer")
    g.add_argument("--sanitizer-budget", type=seconds, default=SANITIZER_BUDGET_S, metavar="S",
                   help="seconds the sanitizer pass may take in all (default "
                   f"{SANITIZER_BUDGET_S:g}); runs it leaves are reported as not run")
    g.add_argument("--no-gates", action="store_true",
                   help="force racy runs by the timed delays alone, without gates")
    g.add_argument("--out", default="reports/gpu", metavar="DIR",
                   help="folder for the report (default reports/gpu)")
    g.add_argument("--jobs", type=count(1), default=None, metavar="N",
                   help="processes planning on the simulator (default: CPUs, at most 16)")
    g.add_argument("--deadline", type=seconds, default=None, metavar="S",
                   help="start no new run after S seconds; report the runs done")
    _memory_flag(g)
    calibrate_cmd.add_profile_argument(g)
    g.set_defaults(func=_cmd_gpu_check)


#: One function per subcommand, each adding its parser. A new command registers here (the
#: ``check`` subcommand of overlap_harness/check_cmd.py appends its own ``add_parser``).
SUBCOMMANDS: list[Callable[[SubParsers], None]] = [
    _add_run, _add_report, _add_plot, _add_whatif, _add_explore, _add_gpu_check,
    check_cmd.add_parser, conformance_cli.add_parser, calibrate_cmd.add_parser,
    sglang_loop_cli.add_parser, vllm_cli.add_parser, tokenspeed_cli.add_parser,
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to render the docs' usage)."""
    p = OneLineParser(
        prog="overlap-harness",
        description="Simulate and verify overlap-scheduling protocols: races by happens-before.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"overlap-harness {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``overlap-harness`` console script; returns the exit status.

    Bad input and usage give 2 with one line per problem; Ctrl-C gives 130 with one line; any
    other exception is our bug and gives 3 with its traceback (see :data:`EXIT_CODES`)."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
    except ScenarioError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return EXIT_BAD_INPUT
    except HarnessError as exc:
        print(f"overlap-harness: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\noverlap-harness: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (``| head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception:
        traceback.print_exc()
        print("overlap-harness: internal error: this is a bug in overlap-harness, please "
              "report it with the traceback above", file=sys.stderr)
        return EXIT_INTERNAL


def console_main() -> None:
    """The console script and ``python -m overlap_harness``: :func:`main`, then exit with its
    status. After Ctrl-C, and after a GPU-mode recording, the process leaves without
    interpreter teardown: after Ctrl-C it would hold the terminal while it collects an
    engine's objects; after a GPU-mode recording torch cannot unregister its GPU trace hooks,
    and during teardown every CUDA free calls them and fails (``trace hook execution failed:
    KeyError: '__import__'``), one line per free."""
    status = main()
    gpu_mode = sys.modules.get("overlap_harness.recorder.gpu_mode")
    # after Ctrl-C the process ends now: the interpreter's teardown of an engine's objects
    # (SGLang's, torch's: a garbage collection of millions) held the terminal 20 s and more
    if status == EXIT_INTERRUPTED or (gpu_mode is not None and gpu_mode.trace_active()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    console_main()
