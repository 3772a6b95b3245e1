"""``overlap-harness vllm``: vLLM's own async-scheduling code, every variant, under the
recorder.

Exit 0 when no variant races, 1 when one does, 2 on bad input or when the tree cannot be driven
(vLLM does not import from it, or a variant's run crashes: an attribute or call the driver did
not plan for, which is how changed vLLM code shows itself) with one line naming what. With
``--necessity`` every sync site of the driven functions is removed in turn and the table is
printed (and written with ``--json``/``--out``); the exit status still reports the intact
code's races.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.command import (
    add_engine_options,
    apply_output_options,
    fail,
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
from overlap_harness.output_paths import prepare_outputs

PROG = "overlap-harness vllm"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``vllm`` subcommand; its handler is ``args.func``."""
    parser = subparsers.add_parser(
        "vllm", help="run vLLM's own async-scheduling code (V1 runner, Model Runner V2, the "
        "engine core's batch queue) under the recorder (CPU, CUDA faked); --necessity "
        "removes each sync site in turn")
    add_engine_options(
        parser, "vllm", source_help="a directory holding the vllm package (a vLLM checkout, "
        "or a site-packages); default: the installed vllm",
        out_help="write vllm.json (and vllm.md with --necessity), and per variant the "
        "timeline plot of one iteration, Perfetto and SARIF")
    add_pr_options(parser, "vllm")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Load the tree, run the variants (and the table), report, return the exit status."""
    apply_output_options(args)  # --quiet, --verbose
    if args.sarif and args.base is None:
        return fail(PROG, "--sarif needs --base (it locates a pull request's races at its "
                    "changed lines; --out writes each variant's SARIF)")
    prepare_outputs(files={"--json": args.json, "--sarif": args.sarif},
                    folders={"--out": args.out})
    if args.base is not None:  # a pull request's view: both trees, each in a child
        from overlap_harness.engines.core.pr_view.view import run as run_pr_view

        return run_pr_view(args, "vllm", PROG)
    from overlap_harness.engines.vllm import environment  # deferred: imports torch

    try:
        info = environment.load(args.vllm_src)
    except environment.VllmUnavailable as exc:  # the JSON still says why
        return fail_written(PROG, " ".join(str(exc).split()), {"source": args.vllm_src},
                            _documents(args))
    from overlap_harness.engines.core.results import name_files_relative_to
    from overlap_harness.engines.vllm import necessity

    name_files_relative_to(Path(info.location).parent)  # vllm/v1/..., overlap_harness/...
    known = list(necessity.variant_runs())
    names = args.variant or known
    if (message := unknown_variants(names, known)) is not None:
        return fail(PROG, message)
    print(f"vllm {info.version} from {info.location} (import {info.import_seconds:.1f} s)")
    not_applicable = _not_applicable(names)
    stopped = False  # Ctrl-C: what finished is written, marked partial
    try:
        outcomes, errors = run_variants([n for n in names if n not in not_applicable],
                                        necessity.run_outcome,
                                        lambda outcome: f"{outcome.ops} ops", _reports(args))
    except Interrupted as stop:
        (outcomes, errors), stopped = stop.finished, True
    names = list(outcomes)  # the variants that ran
    document: dict[str, Any] = {
        "source": info.location, "vllm_version": info.version, "variants": names,
        "not_applicable": [{"variant": n, "reason": r} for n, r in not_applicable.items()],
        "races": [r for o in outcomes.values() for r in o.races]}
    if (status := stop_early(PROG, document, errors, stopped, _documents(args))) is not None:
        return status  # Ctrl-C, or a variant the tree could not drive: what ran is written
    if not names:
        return fail(PROG, "no variant applies to this tree: "
                    + "; ".join(f"{n}: {r}" for n, r in not_applicable.items()))
    if args.necessity:
        try:
            document["necessity"] = timed_necessity(
                len(necessity.sites()), lambda: necessity.table(names, outcomes, args.jobs))
        except Interrupted as stop:  # the rows of the sites that finished
            document["necessity"] = stop.finished
            return interrupted(PROG, document, _documents(args))
    write_document(document, _documents(args))
    if args.out and args.necessity:
        from overlap_harness.engines.core.report import necessity_markdown

        md = args.out / "vllm.md"
        md.write_text(necessity_markdown(f"vLLM {info.version}: sync sites of the driven "
                                         "async-scheduling code", info.location, names,
                                         document["necessity"]))
        print(f"wrote {md}")
    return 1 if document["races"] else 0


def _not_applicable(names: list[str]) -> dict[str, str]:
    """The variants of ``names`` the loaded tree lacks the code of, each with the reason
    (:mod:`.release_features`), printed as they are found."""
    from overlap_harness.engines.vllm.release_features import not_applicable_reason

    reasons = {}
    for name in names:
        if (reason := not_applicable_reason(name)) is not None:
            reasons[name] = reason
            print(f"  {name}: not applicable ({reason})")
    return reasons


def _documents(args: argparse.Namespace) -> list[Path]:
    """Where the command's JSON goes: ``--json`` and ``--out``'s vllm.json."""
    return ([args.json] if args.json else []) + ([args.out / "vllm.json"] if args.out else [])


def _reports(args: argparse.Namespace) -> Any:
    """With ``--out``: the writer of one variant's reports (timeline plot, Perfetto, SARIF),
    called as each variant finishes; else None."""
    if not args.out:
        return None
    from overlap_harness.engines.vllm.reports import write_variant_reports

    return lambda name: write_variant_reports(name, args.out)
