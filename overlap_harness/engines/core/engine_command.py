"""An engine command's run, engine-neutral: the tree loaded, the variants run, the necessity
table, the JSON, the per-variant reports and the pull-request view, for an adapter that hands
over an :class:`EngineCommand`. Also the run of one variant as the core's outcome
(:func:`watch_outcome`) and the pull-request child's side (:func:`watch_side`), which every
adapter whose variants return a recorder ``Watch`` shares."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.command import (
    apply_output_options,
    fail,
    fail_all,
    run_variants,
    timed_necessity,
    unknown_variants,
    write_document,
)
from overlap_harness.engines.core.necessity import format_error
from overlap_harness.engines.core.results import VariantOutcome, race_record
from overlap_harness.output_paths import prepare_outputs


@dataclass(frozen=True)
class EngineCommand:
    """What an adapter hands the core: its name (``--NAME-src``, ``NAME.json``), the title
    of its necessity page, how its tree is loaded (``load(src)`` returns an object with
    ``version`` and ``location``, or raises ``unavailable``), and the module functions of its
    variants (``variant_runs()``, ``sites()``, ``run_outcome(name)``,
    ``table(names, outcomes, jobs)``) and reports (``write_variant_reports(name, out)``)."""

    engine: str
    prog: str
    title: str
    load: Callable[[str | None], Any]
    unavailable: type[Exception]
    necessity: Callable[[], Any]
    reports: Callable[[], Any]


def run_engine_command(args: argparse.Namespace, command: EngineCommand) -> int:
    """Load the tree, run the variants (and the table), report, return the exit status."""
    apply_output_options(args)
    if args.sarif and args.base is None:
        return fail(command.prog, "--sarif needs --base (it locates a pull request's races "
                    "at its changed lines; --out writes each variant's SARIF)")
    prepare_outputs(files={"--json": args.json, "--sarif": args.sarif},
                    folders={"--out": args.out})
    if args.base is not None:
        from overlap_harness.engines.core.pr_view.view import run as run_pr_view

        return run_pr_view(args, command.engine, command.prog)
    try:
        info = command.load(getattr(args, f"{command.engine}_src"))
    except command.unavailable as exc:
        return fail(command.prog, " ".join(str(exc).split()))
    from overlap_harness.engines.core.results import name_files_relative_to

    # every output names the engine's files from the tree's root (tokenspeed/runtime/...)
    name_files_relative_to(Path(info.location).parent)
    necessity = command.necessity()
    known = list(necessity.variant_runs())
    names = args.variant or known
    if (message := unknown_variants(names, known)) is not None:
        return fail(command.prog, message)
    print(f"{command.engine} {info.version} from {info.location} "
          f"(import {info.import_seconds:.1f} s)")
    outcomes, errors = run_variants(names, necessity.run_outcome,
                                    lambda outcome: f"{outcome.ops} ops")
    if errors:
        return fail_all(command.prog, errors)
    document: dict[str, Any] = {
        "source": info.location, f"{command.engine}_version": info.version,
        "variants": names, "races": [r for o in outcomes.values() for r in o.races]}
    if args.necessity:
        document["necessity"] = timed_necessity(
            len(necessity.sites()), lambda: necessity.table(names, outcomes, args.jobs))
    write_document(document, ([args.json] if args.json else [])
                   + ([args.out / f"{command.engine}.json"] if args.out else []))
    if args.out:
        reports = command.reports()
        for name in names:
            for path in reports.write_variant_reports(name, args.out):
                print(f"wrote {path}")
    if args.out and args.necessity:
        from overlap_harness.engines.core.report import necessity_markdown

        md = args.out / f"{command.engine}.md"
        md.write_text(necessity_markdown(command.title.format(version=info.version),
                                         info.location, names, document["necessity"]))
        print(f"wrote {md}")
    return 1 if document["races"] else 0


def package_root(src: str | None, package: str, unavailable: type[Exception]) -> Path | None:
    """The folder to put first on ``sys.path`` for ``--PACKAGE-src SRC``: SRC when it holds
    the package, SRC's parent when SRC is the package, SRC/python in a checkout; None for the
    installed package. Raises ``unavailable`` when SRC is not a folder or holds no package."""
    if src is None:
        return None
    path = Path(src).expanduser().resolve()
    if not path.is_dir():
        raise unavailable(f"--{package}-src {src}: not a folder")
    for root in (path, path / "python"):
        if (root / package / "__init__.py").is_file():
            return root
    if path.name == package and (path / "__init__.py").is_file():
        return path.parent
    raise unavailable(f"--{package}-src {src}: holds no {package} package "
                      f"(no {package}/__init__.py)")


def add_engine_parser(subparsers: argparse._SubParsersAction, engine: str, help_text: str,
                      source_help: str, out_help: str,
                      run: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """Add an engine's subcommand with the shared options and the pull-request options;
    its handler is ``run``."""
    from overlap_harness.engines.core.command import add_engine_options
    from overlap_harness.engines.core.pr_view.options import add_pr_options

    parser = subparsers.add_parser(engine, help=help_text)
    add_engine_options(parser, engine, source_help=source_help, out_help=out_help)
    add_pr_options(parser, engine)
    parser.set_defaults(func=run)
    return parser


def watch_outcome(name: str, run: Callable[[], Any]) -> VariantOutcome:
    """One run of variant ``name`` (``run()`` returns the recorder's ``Watch``) as the core's
    outcome; a crash becomes its ``error``."""
    started = time.process_time()
    try:
        watcher = run()
    except Exception as exc:  # the tree cannot be driven: the caller reports the line
        return VariantOutcome(name, error=format_error(exc),
                              seconds=time.process_time() - started)
    return VariantOutcome(name, [race_record(r, name) for r in watcher.races],
                          ops=watcher.recording.ops_recorded,
                          seconds=time.process_time() - started,
                          unknown_ops=[u.name for u in watcher.unknown_ops])


@dataclass(frozen=True)
class WatchedEngine:
    """What every adapter whose driven functions are listed (``targets``: owner, attribute)
    and whose variants return the recorder's ``Watch`` (``variant_runs``: name -> run) has
    alike: its sync sites, one variant's outcome, the necessity table."""

    targets: Callable[[], list[tuple[Any, str]]]
    variant_runs: Callable[[], dict[str, Callable[[], Any]]]

    def sites(self) -> list[Any]:
        """Every sync site of the driven functions."""
        from overlap_harness.engines.core.sites import function_sites

        return [s for owner, attribute in self.targets()
                for s in function_sites(owner, attribute)]

    def run_outcome(self, name: str) -> VariantOutcome:
        """One run of variant ``name`` as the core's outcome (a crash becomes its error)."""
        return watch_outcome(name, self.variant_runs()[name])

    def table(self, names: Sequence[str], baseline: dict[str, VariantOutcome],
              jobs: int = 1) -> list[Any]:
        """The necessity table of the driven syncs over the variants ``names``."""
        from overlap_harness.engines.core.necessity import necessity_table

        return necessity_table(self.sites(), names, baseline, self.run_outcome, jobs)


def watch_side(version: str, runs: dict[str, Callable[[], Any]], table: Callable[..., Any],
               run_outcome: Callable[[str], VariantOutcome]) -> Any:
    """The pull-request child's side of an adapter whose variants return a ``Watch``."""
    from overlap_harness.engines.core.pr_view.child import EngineSide

    def run(name: str) -> tuple[list[Any], Any]:
        watcher = runs[name]()
        return watcher.races, watcher

    return EngineSide(version, list(runs), run, table, run_outcome)


def write_reports_of(label: str, watcher: Any, out: Path, iteration: int) -> list[Path]:
    """The ``--out`` reports of one variant's finished watch (see
    :func:`~overlap_harness.engines.core.variant_reports.write_watch_reports`)."""
    from overlap_harness.engines.core.variant_reports import write_watch_reports

    return write_watch_reports(label, watcher, out, iteration)


__all__: Sequence[str] = ("EngineCommand", "run_engine_command", "watch_outcome", "watch_side")
