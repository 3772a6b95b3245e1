"""``overlap-harness sglang``: SGLang's own overlap loop, every variant, under the recorder.

Exit 0 when no variant races, 1 when one does, 2 on bad input or when the tree cannot be driven
(SGLang does not import, or a variant's run crashes: an attribute or call the driver did not
plan for, which is how a changed scheduler shows itself) with one line naming what. With
``--necessity`` every sync site on the path is removed in turn and the table is printed (and
written with ``--json``); the exit status still reports the intact code's races.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.command import (
    add_engine_options,
    fail,
    fail_all,
    run_variants,
    timed_necessity,
    unknown_variants,
    write_document,
)
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
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the tree, run the variants (and the table), report, return the exit status."""
    from overlap_harness.engines.sglang import environment  # deferred: imports torch

    if args.loop_report and not args.necessity:
        return fail(PROG, "--loop-report needs --necessity (the report is the necessity table "
                     "beside the model)")
    # every output is checked (folders made) before the minutes of import and runs
    prepare_outputs(folders={"--out": args.out, "--loop-report": args.loop_report},
                    files={"--json": args.json})
    try:
        tree = environment.load(args.sglang_src)
    except environment.SglangTreeError as exc:
        return fail(PROG, str(exc))
    from overlap_harness.engines.sglang.path_sites import path_sites, run_outcome
    from overlap_harness.engines.sglang.variants import VARIANTS

    names = args.variant or list(VARIANTS)
    if (message := unknown_variants(names, list(VARIANTS))) is not None:
        return fail(PROG, message)
    print(f"sglang {tree.version} from {tree.package_dir} (import {tree.import_s:.1f} s)")
    outcomes, errors = run_variants(names, run_outcome,
                                    lambda outcome: f"{outcome.iterations} iterations")
    if errors:
        return fail_all(PROG, errors)
    document: dict[str, Any] = {
        "source": str(tree.package_dir), "sglang_version": tree.version,
        "variants": names, "races": [r for o in outcomes.values() for r in o.races]}
    if args.necessity:
        from overlap_harness.engines.core.necessity import necessity_table

        sites = path_sites()
        document["necessity"] = timed_necessity(
            len(sites), lambda: necessity_table(sites, names, outcomes, run_outcome, args.jobs))
    write_document(document, ([args.json] if args.json else [])
                   + ([args.out / "sglang-loop.json"] if args.out else []))
    if args.out:
        from overlap_harness.engines.sglang.reports import write_variant_reports

        for name in names:
            for path in write_variant_reports(name, args.out):
                print(f"wrote {path}")
    if args.loop_report:
        from overlap_harness.engines.sglang.loop_report import write as write_loop_report

        for path in write_loop_report(document, args.loop_report):
            print(f"wrote {path}")
    if args.out and args.necessity:
        from overlap_harness.engines.sglang.table import markdown

        md = args.out / "sglang-loop.md"
        md.write_text(markdown(document))
        print(f"wrote {md}")
    return 1 if document["races"] else 0

