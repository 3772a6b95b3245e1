"""``overlap-harness sglang``: SGLang's own overlap loop, every variant, under the recorder.

Exit 0 when no variant races, 1 when one does, 2 on bad input or when the tree cannot be driven
(SGLang does not import, or a variant's run crashes: an attribute or call the driver did not
plan for, which is how a changed scheduler shows itself) with one line naming what. With
``--necessity`` every sync site on the path is removed in turn and the table is printed (and
written with ``--json``); the exit status still reports the intact code's races.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from overlap_harness.cli_options import count, seconds
from overlap_harness.engines.core.command import (
    add_engine_options,
    apply_output_options,
    fail,
    fail_all,
    fail_written,
    interrupted,
    run_variants,
    stop_early,
    timed_necessity,
    unknown_variants,
    write_document,
)
from overlap_harness.engines.core.interrupted import Interrupted
from overlap_harness.engines.core.pr_view.options import add_pr_options
from overlap_harness.engines.sglang.gpu.command import RERUN_MODES
from overlap_harness.output_paths import prepare_outputs

PROG = "overlap-harness sglang"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``sglang`` subcommand; its handler is ``args.func``."""
    parser = subparsers.add_parser(
        "sglang", help="run SGLang's own event_loop_overlap under the recorder (CPU, CUDA "
        "faked); --necessity removes each sync site in turn")
    add_engine_options(
        parser, "sglang", source_help="a directory holding the sglang package, or an SGLang "
        "checkout (its python/ is used); default: the installed sglang",
        out_help="write sglang-loop.json (and .md with --necessity), and per variant the "
        "timeline plot of one iteration, Perfetto and SARIF")
    parser.add_argument("--loop-report", type=Path, metavar="DIR", default=None,
                        help="with --necessity: write sglang-VERSION-loop.json and .md in DIR, "
                        "each site's real verdict beside the model's removal of its "
                        "counterpart (reports/conformance holds the committed one)")
    parser.add_argument("--gpu", action="store_true",
                        help="on a CUDA device: every site the loop report judged removed in "
                        "turn, its race forced by delaying a stream, values compared with the "
                        "serial answer (docs/sglang-loop.md: GPU mode)")
    parser.add_argument("--gpu-report", type=Path, metavar="DIR", default=None,
                        help="with --gpu: write sglang-VERSION-loop-gpu.json and .md in DIR")
    parser.add_argument("--loop-json", type=Path, metavar="FILE", default=None,
                        help="with --gpu: the loop report to check (default: "
                        "reports/conformance/sglang-0.5.23-loop.json)")
    parser.add_argument("--gpu-timeout", type=seconds, metavar="S", default=400.0,
                        help="with --gpu: seconds one site's child may run (default 400)")
    parser.add_argument("--gpu-deadline", type=seconds, metavar="S", default=float("inf"),
                        help="with --gpu: start no site after S seconds and stop running ones "
                        "(their rows are kept, marked not run); default: none")
    parser.add_argument("--gpu-resume", type=Path, metavar="FILE", default=None,
                        help="with --gpu: an earlier GPU report (json) of the same tree and "
                        "device; its rows with trials are kept, only the others run")
    parser.add_argument("--gpu-kernels", choices=("sglang", "stand_in"), default="sglang",
                        help="with --gpu: SGLang's own kernels on the device (default; the "
                        "harness's torch implementation only where a compiled sgl_kernel op "
                        "is missing, named in each trial) or 'stand_in': the harness's torch "
                        "implementations throughout (they read index values on the host)")
    parser.add_argument("--gpu-rerun", choices=RERUN_MODES,
                        default="unsettled",
                        help="with --gpu-resume: which of its rows run again: 'unsettled' "
                        "(default: every row not yet evidence, docs/sglang-loop.md), "
                        "'unrun' (rows whose trials did not run, an error or the deadline, "
                        "and, in every mode, rows a deadline stopped short, whose delay now "
                        "grows further, or controls with a crashed trial), so a device call "
                        "finishes the table first, or "
                        "'unshown' (those, and race rows with neither a wrong value nor a "
                        "made crash, none of whose trials started from dirtied caches; their "
                        "earlier trials kept)")
    parser.add_argument("--repro", nargs=2, metavar=("VARIANT", "SITE"), default=None,
                        help="with --gpu: one row of the GPU table as a maintainer's repro: "
                        "the serial answer, then VARIANT with SITE (file:line, or - for none) "
                        "removed and one delay (--repro-forcing), the first wrong value; "
                        "a wrong row of the GPU report names its command (repro)")
    parser.add_argument("--repro-forcing", metavar="LABEL", default=None,
                        help="with --repro: the delay, as the GPU report labels it (e.g. "
                        "forward_stream@earlier+8388608cy: the race's earlier side on that "
                        "stream held 2^23 cycles before each of its ops)")
    parser.add_argument("--repro-trials", type=count(1), metavar="N", default=3,
                        help="with --repro: forced trials until one shows a wrong value or a "
                        "crash (default 3; a made race need not corrupt a value every time)")
    parser.add_argument("--gpu-check-cpu", type=Path, metavar="FILE", default=None,
                        help="a GPU report (json; no --gpu: this runs on the CPU): each row "
                        "whose race the device could not make (why timing) checked against "
                        "the CPU mode (the calls that ordered it on the device looked up "
                        "among the ops the CPU mode records there), written into the row's "
                        "cpu_verdict_checked; the report's json and md rewritten in place")
    parser.add_argument("--config", action="append", metavar="KEY=VALUE", default=[],
                        help="run only the variants of this SGLang configuration "
                        "(repeatable, e.g. plan_stream=off; the keys: docs/sglang-loop.md, "
                        "Configurations); the others are listed as not selected")
    add_pr_options(parser, "sglang")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the tree, run the variants (and the table), report, return the exit status."""
    apply_output_options(args)  # --quiet, --verbose
    if args.sarif and args.base is None:
        return fail(PROG, "--sarif needs --base (it locates a pull request's races at its "
                    "changed lines; --out writes each variant's SARIF)")
    if args.gpu_report and not args.gpu:
        return fail(PROG, "--gpu-report needs --gpu")
    if (args.repro or args.repro_forcing) and not args.gpu:
        return fail(PROG, "--repro and --repro-forcing need --gpu (a repro runs on a CUDA "
                    "device)")
    if args.repro and not args.repro_forcing:
        return fail(PROG, "--repro needs --repro-forcing LABEL (a GPU report's wrong row "
                    "names both in its repro)")
    # every output is checked (folders made) before the minutes of import and runs
    prepare_outputs(folders={"--out": args.out, "--loop-report": args.loop_report,
                             "--gpu-report": args.gpu_report},
                    files={"--json": args.json, "--sarif": args.sarif})
    from overlap_harness.engines.sglang.configurations import ConfigError

    try:
        not_selected = _apply_config(args)
    except ConfigError as exc:
        return fail_all(PROG, exc.problems)
    except ValueError as exc:  # an unknown variant
        return fail(PROG, str(exc))
    if args.base is not None:  # a pull request's view: both trees, each in a child
        from overlap_harness.engines.core.pr_view.view import run as run_pr_view

        return run_pr_view(args, "sglang", PROG)
    from overlap_harness.engines.sglang import environment  # deferred: imports torch

    if args.gpu_check_cpu is not None:
        from overlap_harness.engines.sglang.gpu.command import check_cpu

        return check_cpu(args)
    if args.gpu:
        from overlap_harness.engines.sglang.gpu.command import run as run_gpu

        return run_gpu(args)
    if args.loop_report and not args.necessity:
        return fail(PROG, "--loop-report needs --necessity (the report is the necessity table "
                     "beside the model)")
    try:
        tree = environment.load(args.sglang_src)
    except environment.SglangTreeError as exc:  # the JSON still says why
        return fail_written(PROG, str(exc), {"source": args.sglang_src}, _documents(args))
    from overlap_harness.engines.core.reach import IntactReach
    from overlap_harness.engines.core.results import name_files_relative_to
    from overlap_harness.engines.sglang.configurations import configuration
    from overlap_harness.engines.sglang.report.path_sites import path_sites, run_outcome
    from overlap_harness.engines.sglang.variants import VARIANTS

    name_files_relative_to(tree.package_dir.parent)  # sglang/srt/..., overlap_harness/...

    names = args.variant or list(VARIANTS)
    print(f"sglang {tree.version} from {tree.package_dir} (import {tree.import_s:.1f} s)")
    for name, reason in not_selected.items():
        print(f"  {name}: not selected ({reason})")
    not_applicable = _not_applicable(names)
    sites = path_sites() if args.necessity else []
    reach = IntactReach(sites) if args.necessity else None
    stopped = False  # Ctrl-C: what finished is written, marked partial
    try:
        outcomes, errors = run_variants([n for n in names if n not in not_applicable],
                                        _intact_run(run_outcome, reach),
                                        lambda outcome: f"{outcome.iterations} iterations",
                                        _reports(args))
    except Interrupted as stop:
        (outcomes, errors), stopped = stop.finished, True
    names = list(outcomes)  # the variants that ran
    document: dict[str, Any] = {
        "source": str(tree.package_dir), "sglang_version": tree.version,
        "variants": names,
        "not_applicable": [{"variant": n, "reason": r} for n, r in not_applicable.items()],
        "config": dict(args.config_wanted),
        "not_selected": [{"variant": n, "reason": r} for n, r in not_selected.items()],
        "configurations": {n: configuration(VARIANTS[n]) for n in names},
        "races": [r for o in outcomes.values() for r in o.races]}
    if (status := stop_early(PROG, document, errors, stopped, _documents(args))) is not None:
        return status  # Ctrl-C, or a variant the tree could not drive: what ran is written
    if args.necessity:
        from overlap_harness.engines.core.necessity import necessity_table

        try:
            document["necessity"] = timed_necessity(
                len(sites), lambda: necessity_table(sites, names, outcomes, run_outcome,
                                                    args.jobs, reach=reach))
        except Interrupted as stop:  # the rows of the sites that finished
            document["necessity"] = stop.finished
            return interrupted(PROG, document, _documents(args))
    write_document(document, _documents(args))
    if args.loop_report:
        from overlap_harness.engines.sglang.report.loop_report import write as write_loop_report

        for path in write_loop_report(document, args.loop_report):
            print(f"wrote {path}")
    if args.out and args.necessity:
        from overlap_harness.engines.sglang.report.necessity_table import markdown

        md = args.out / "sglang-loop.md"
        md.write_text(markdown(document))
        print(f"wrote {md}")
    return 1 if document["races"] else 0


def _intact_run(run_outcome: Callable[[str], Any], reach: Any) -> Callable[[str], Any]:
    """One intact variant's run as the command makes it: with ``--necessity`` noting the
    sync sites it reaches (``reach``, an :class:`~overlap_harness.engines.core.reach.
    IntactReach`: the table then needs no probed pass), and counting no loop pass (a line
    tracer on every frame): only reports read the counted marks, and ``--out``'s come from
    a run of their own (:mod:`.report.plots`); the race records carry the iterations the
    driver names, the same either way."""
    from overlap_harness.recorder.iterations import loops_not_counted

    run = reach.counted(run_outcome) if reach is not None else run_outcome

    def run_uncounted(name: str) -> Any:
        with loops_not_counted():
            return run(name)
    return run_uncounted


def _reports(args: argparse.Namespace) -> Any:
    """With ``--out``: the writer of one variant's reports (timeline plot, Perfetto, SARIF),
    called as each variant finishes; else None."""
    if not args.out:
        return None
    from overlap_harness.engines.sglang.report.plots import write_variant_reports

    return lambda name: write_variant_reports(name, args.out)


def _documents(args: argparse.Namespace) -> list[Path]:
    """Where the command's JSON goes: ``--json`` and ``--out``'s sglang-loop.json."""
    return ([args.json] if args.json else []) + ([args.out / "sglang-loop.json"]
                                                 if args.out else [])


def _apply_config(args: argparse.Namespace) -> dict[str, str]:
    """Resolve ``--variant`` and ``--config`` into ``args.variant`` (the variants to run) and
    ``args.config_wanted``; return the variants ``--config`` left out, each with why. Raises
    ``ValueError`` on an unknown variant or a bad or empty selection."""
    from overlap_harness.engines.sglang import configurations
    from overlap_harness.engines.sglang.variants import VARIANTS

    names = args.variant or list(VARIANTS)
    if (message := unknown_variants(names, list(VARIANTS))) is not None:
        raise ValueError(message)
    args.config_wanted = configurations.parse(args.config)
    if not args.config_wanted:
        return {}
    chosen, left_out = configurations.select(VARIANTS, names, args.config_wanted)
    args.variant = chosen
    return left_out


def _not_applicable(names: list[str]) -> dict[str, str]:
    """The variants of ``names`` the loaded release cannot run, each with the reason (the
    feature it lacks: :mod:`.release_features`), printed as they are found."""
    from overlap_harness.engines.sglang.release_features import not_applicable_reason
    from overlap_harness.engines.sglang.variants import VARIANTS

    reasons = {}
    for name in names:
        if (reason := not_applicable_reason(VARIANTS[name])) is not None:
            reasons[name] = reason
            print(f"  {name}: not applicable ({reason})")
    return reasons
