"""The command line: ``overlap-harness run PATH...`` and friends.

Exit status: 0 when every verdict matches its expectation, 1 when one does not, 2 on bad
input (one line per problem on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from model.errors import HarnessError, ScenarioError
from overlap_harness import check_cmd
from overlap_harness.gpu_limits import SANITIZER_BUDGET_S

EXIT_OK, EXIT_MISMATCH, EXIT_BAD_INPUT = 0, 1, 2


class _Progress:
    """A one-line progress bar on a terminal; a line per 10% otherwise (CI logs)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = -1

    def __call__(self, i: int, n: int, what: str) -> None:
        if not self.enabled or n == 0:
            return
        if self.tty:
            bar = "#" * (30 * i // n)
            end = "\n" if i == n else ""
            sys.stderr.write(f"\r[{bar:<30}] {i}/{n} {what[:50]:<50}{end}")
            sys.stderr.flush()
        elif (tenth := 10 * i // n) != self.last:
            self.last = tenth
            sys.stderr.write(f"[{i}/{n}] {what}\n")


def _table(rows: list[list[str]], head: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r) for r in rows]
    return "\n".join(lines)


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f}"


def results_table(results) -> str:
    """The results table: scenario, mutation, verdict, races, manifest, host stall, bubbles."""
    head = ["scenario", "mutation", "expect", "verdict", "races", "manifest",
            "host stall us", "fwd bubbles us", "ok"]
    rows = []
    for r in results:
        m = r.metrics
        races = ", ".join(r.race_keys()) or "-"
        rows.append([r.scenario, r.mutation or "base", r.expect, r.verdict,
                     races if len(races) < 60 else races[:57] + "...",
                     "yes" if r.manifest else "no", _us(m and m.host_stall_ns),
                     _us(m and m.forward_idle_ns), "ok" if r.ok else "FAIL"])
    return _table(rows, head)


def _cmd_run(args: argparse.Namespace) -> int:
    from scenarios.loader import load_paths

    scenarios = load_paths(args.paths)  # bad input stops here, before anything runs

    from overlap_harness.runner import run_scenarios
    from reports.jsonout import to_json
    from reports.junit import write_junit

    results = run_scenarios(scenarios, progress=_Progress(not args.quiet))
    print(results_table(results))
    for r in results:
        if not r.ok:
            print(f"\nFAIL {r.name}: expected {r.expect}, computed {r.verdict}"
                  + (f" ({r.error})" if r.error else ""))
            if r.missing:
                print("  expected races not found: " + ", ".join(r.missing))
            for race in r.races[:5]:
                print("  " + race.describe().replace("\n", "\n  "))
    if args.json:
        text = to_json(results)
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
    if args.junit:
        write_junit(results, args.junit)
    rows = _print_necessity(scenarios) if args.necessity else []
    if not args.no_reports:
        from reports.writer import write_all

        path = write_all(results, args.out, rows, progress=_Progress(not args.quiet))
        print(f"\nreports: {path}")
    failed = sum(not r.ok for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return EXIT_MISMATCH if failed else EXIT_OK


def _print_necessity(scenarios) -> list[list[str]]:
    from overlap_harness.necessity import necessity, race_free_base

    rows = []
    for sc in scenarios:
        if not race_free_base(sc):
            continue
        for row in necessity(sc):
            rows.append([row.scenario, row.label, "necessary" if row.necessary else "redundant",
                         ", ".join(row.races) or "-", "yes" if row.manifest else "no",
                         _us(row.stall_saved_ns), _us(row.idle_saved_ns)])
    print("\nSync necessity (each label removed alone)")
    print(_table(rows, ["scenario", "sync", "verdict", "races when removed", "manifest",
                        "stall saved us", "idle saved us"]))
    return rows


def _cmd_report(args: argparse.Namespace) -> int:
    args.necessity, args.no_reports, args.json, args.junit = True, False, None, None
    return _cmd_run(args)


def _cmd_plot(args: argparse.Namespace) -> int:
    from overlap_harness.runner import run_spec
    from reports.timeline import plot_timeline, save_plot
    from reports.writer import safe_name
    from scenarios.expand import expand
    from scenarios.loader import load_scenario

    specs = expand(load_scenario(args.scenario))
    names = [s.mutation_name or "base" for s in specs]
    if (args.mutation or "base") not in names:
        raise HarnessError(f"{args.scenario}: no mutation {args.mutation!r}; runs are "
                           + "|".join(names))
    spec = specs[names.index(args.mutation or "base")]
    window = None
    if args.window:
        a, _, b = args.window.partition(":")
        if not (a.isdigit() and b.isdigit() and int(a) <= int(b)):
            raise HarnessError(f"--window: expected A:B with A <= B, got {args.window!r}")
        window = (int(a), int(b))
    result = run_spec(spec)
    stem = args.out or f"reports/latest/plots/{safe_name(spec.run_id)}"
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    paths = save_plot(plot_timeline(result, window=window), stem)
    print("\n".join(str(p) for p in paths))
    return EXIT_OK


def _cmd_whatif(args: argparse.Namespace) -> int:
    from overlap_harness.whatif import HEAD, format_rows, whatif
    from scenarios.loader import load_scenario

    sc = load_scenario(args.scenario)
    print(f"What-if on {sc.name} ({sc.workload.iterations} iterations)")
    print(_table(format_rows(whatif(sc)), HEAD))
    return EXIT_OK


def _cmd_explore(args: argparse.Namespace) -> int:
    from overlap_harness.runner import explore_specs
    from scenarios.loader import load_paths

    scenarios = load_paths(args.paths)
    rows, failed = explore_specs(scenarios, budget=args.explore,
                                 time_limit_s=args.time_limit,
                                 progress=_Progress(not args.quiet), jobs=args.jobs)
    print(_table(rows, ["run", "races", "manifest", "source", "tried", "shrunk delays"]))
    print(f"\n{len(rows) - failed} manifest, {failed} not made manifest")
    return EXIT_MISMATCH if failed else EXIT_OK


def _cmd_gpu_check(args: argparse.Namespace) -> int:
    from overlap_harness.gpu_suite import run_gpu_check

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
    return run_gpu_check(args.paths, trials=args.trials, baseline_trials=args.baseline_trials,
                         sanitizer=args.with_torch_sanitizer, out=Path(args.out),
                         jobs=args.jobs, deadline_s=args.deadline, argv=argv,
                         gated=not args.no_gates, sanitizer_budget_s=args.sanitizer_budget)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used to render the docs' usage)."""
    p = argparse.ArgumentParser(
        prog="overlap-harness",
        description="Simulate and verify overlap-scheduling protocols: races by happens-before.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run scenario files or folders on the simulated device")
    r.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    r.add_argument("--json", metavar="FILE", help="write results as JSON ('-' for stdout)")
    r.add_argument("--junit", metavar="FILE", help="write JUnit XML, one case per run")
    r.add_argument("--necessity", action="store_true",
                   help="remove each sync of each race-free scenario in turn; print which "
                        "are necessary")
    r.add_argument("--out", default="reports/latest", metavar="DIR",
                   help="folder for the reports: summary.html/.md, plots, trace.json, "
                        "junit.xml, results.sarif, results.json (default reports/latest)")
    r.add_argument("--no-reports", action="store_true", help="print the table only")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_run)
    rp = sub.add_parser("report", help="run scenarios and write every report, with the "
                                       "necessity table")
    rp.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    rp.add_argument("--out", default="reports/latest", metavar="DIR", help="output folder")
    rp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    rp.set_defaults(func=_cmd_report)
    pl = sub.add_parser("plot", help="draw the timeline of one run of one scenario")
    pl.add_argument("scenario", help="a scenario .toml file")
    pl.add_argument("--mutation", default="", help="mutation name (default: the base run)")
    pl.add_argument("--window", default=None, metavar="A:B",
                    help="zoom to iterations A..B")
    pl.add_argument("--out", default=None, metavar="FILE",
                    help="output path without extension (writes .png and .svg)")
    pl.set_defaults(func=_cmd_plot)
    w = sub.add_parser("whatif", help="run the protocol variants side by side on one scenario")
    w.add_argument("scenario", help="a scenario .toml file")
    w.set_defaults(func=_cmd_whatif)
    e = sub.add_parser("explore", help="find and shrink a manifest schedule for every racy run")
    e.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    e.add_argument("--explore", type=int, default=64, metavar="N",
                   help="schedules to try per racy run (default 64)")
    e.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds per racy run")
    e.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                   help="explore runs in N processes (multiprocessing pool)")
    e.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=_cmd_explore)
    g = sub.add_parser("gpu-check", help="replay every run on real CUDA streams against the "
                       "simulator; write reports/gpu/<date>-<device>.json and .md")
    g.add_argument("paths", nargs="+", help="scenario .toml files or folders of them")
    g.add_argument("--trials", type=int, default=20, metavar="N",
                   help="trials per schedule (default 20)")
    g.add_argument("--baseline-trials", type=int, default=None, metavar="N",
                   help="no-delay trials of each racy run (default: --trials)")
    g.add_argument("--with-torch-sanitizer", action="store_true",
                   help="also run each spec once under PyTorch's CUDA sanitizer")
    g.add_argument("--sanitizer-budget", type=float, default=SANITIZER_BUDGET_S, metavar="S",
                   help="seconds the sanitizer pass may take in all (default "
                   f"{SANITIZER_BUDGET_S:g}); runs it leaves are reported as not run")
    g.add_argument("--no-gates", action="store_true",
                   help="force racy runs by the timed delays alone, without gates")
    g.add_argument("--out", default="reports/gpu", metavar="DIR",
                   help="folder for the report (default reports/gpu)")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="processes planning on the simulator (default: CPUs, at most 16)")
    g.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="start no new run after S seconds; report the runs done")
    g.set_defaults(func=_cmd_gpu_check)
    check_cmd.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``overlap-harness`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ScenarioError as exc:
        for line in exc.problems:
            print(line, file=sys.stderr)
        return EXIT_BAD_INPUT
    except HarnessError as exc:
        print(f"overlap-harness: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
