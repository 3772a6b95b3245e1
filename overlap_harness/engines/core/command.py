"""What every engine command shares (``overlap-harness sglang``, ``vllm``): its options (one
tree, the variants, the necessity table, the JSON and the output folder, the forked
children), its one-line failures, the run of the variants and the timed necessity table.

The command line builds its parser without importing torch or an engine: what needs more is
imported inside the functions that run."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.cli_options import count
from overlap_harness.engines.core.interrupted import Interrupted


def add_engine_options(parser: argparse.ArgumentParser, engine: str, source_help: str,
                       out_help: str) -> None:
    """Add ``--ENGINE-src PATH``, ``--variant``, ``--necessity``, ``--json FILE``,
    ``--out DIR`` and ``-j N`` to ``parser`` (``source_help`` and ``out_help`` say what the
    engine's tree and output folder hold)."""
    parser.add_argument(f"--{engine}-src", metavar="PATH", default=None, help=source_help)
    parser.add_argument("--variant", action="append", metavar="NAME", default=None,
                        help="run only this variant (repeatable); default: all")
    parser.add_argument("--necessity", action="store_true",
                        help="remove each sync site in turn: necessary / redundant / "
                        "not reached per site and variant")
    parser.add_argument("--json", type=Path, metavar="FILE", default=None,
                        help="write the races (and the necessity table) as JSON")
    parser.add_argument("--out", type=Path, metavar="DIR", default=None, help=out_help)
    parser.add_argument("-j", "--jobs", type=count(1), default=1, metavar="N",
                        help="forked children at a time for --necessity (default 1)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines for --necessity")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the engine's own warnings as it prints them "
                        "(default: one line saying how many were hidden)")


def apply_output_options(args: argparse.Namespace) -> None:
    """Take ``--quiet`` and ``--verbose`` in: the engine's own output shown or summed up
    (:mod:`overlap_harness.engines.core.engine_output`), progress lines on or off
    (:mod:`overlap_harness.engines.core.progress`)."""
    from overlap_harness.engines.core import engine_output, progress

    engine_output.show_engine_output(args.verbose)
    progress.show_progress(not args.quiet)


def fail(command: str, message: str) -> int:
    """Print ``command: message`` on stderr; the exit status of bad input or an undrivable
    tree (2). The engines' held output is summed up first, so the failure is the last line."""
    from overlap_harness.engines.core.engine_output import say_held

    say_held()
    print(f"{command}: {message}", file=sys.stderr)
    return 2


def unknown_variants(names: Sequence[str], known: Sequence[str]) -> str | None:
    """The message for ``--variant`` names the engine does not have, None when all are known."""
    unknown = [n for n in names if n not in known]
    if not unknown:
        return None
    return f"--variant: unknown {', '.join(unknown)} (known: {', '.join(known)})"


def run_variants(names: Sequence[str], run_outcome: Callable[[str], Any],
                 progress: Callable[[Any], str],
                 reports: Callable[[str], Sequence[Path]] | None = None
                 ) -> tuple[dict[str, Any], list[str]]:
    """Run each variant, printing its verdict (``progress`` says how far it got) and its first
    races, then writing its reports (``reports``, ``--out``: a Ctrl-C later leaves them
    written); returns the outcomes of the variants that ran, and one message per variant
    that cannot be driven. A variant that cannot be driven never stops the others: its
    message is printed where its verdict would be, and the runs go on. Ctrl-C raises
    :class:`Interrupted` with ``(outcomes, errors)`` of the variants finished."""
    from overlap_harness.engines.core.engine_output import captured
    from overlap_harness.engines.core.report import describe

    outcomes: dict[str, Any] = {}
    errors: list[str] = []
    try:
        for name in names:
            with captured(f"{name} run", summary=False):  # the engine's log lines: one line
                outcome = run_outcome(name)
            if outcome.error is not None:
                errors.append(f"variant {name} cannot be driven on this tree: {outcome.error}")
                print(f"  {name}: cannot be driven ({outcome.error})")
                continue
            verdict = f"{len(outcome.races)} races" if outcome.races else "race-free"
            print(f"  {name}: {verdict} ({progress(outcome)}, {outcome.seconds:.2f} CPU s)")
            for race in outcome.races[:5]:
                print(f"    {describe(race)}")
            for path in reports(name) if reports is not None else ():
                print(f"wrote {path}")
            outcomes[name] = outcome
    except KeyboardInterrupt:
        raise Interrupted((outcomes, errors)) from None
    return outcomes, errors


def interrupted(command: str, document: dict[str, Any], paths: Sequence[Path]) -> int:
    """After Ctrl-C: write ``document`` (what finished) marked ``partial: true``, say so in
    one line; the exit status of an interrupted command (130)."""
    document["partial"] = True
    write_document(document, paths)
    print(f"{command}: interrupted; what finished is written"
          f"{' (partial: true)' if paths else ''}", file=sys.stderr)
    return 130


def stop_early(command: str, document: dict[str, Any], errors: Sequence[str], stopped: bool,
               paths: Sequence[Path]) -> int | None:
    """After the variants ran: the exit status when the command ends here (Ctrl-C: what
    finished written, partial; a variant that could not be driven: what did run written,
    then each error), else None. ``errors`` go into ``document`` either way."""
    if errors:
        document["errors"] = list(errors)
    if stopped:
        return interrupted(command, document, paths)
    if errors:
        write_document(document, paths)
        return fail_all(command, errors)
    return None


def fail_all(command: str, errors: Sequence[str]) -> int:
    """Print each message as :func:`fail` does; the exit status of an undrivable tree (2)."""
    for message in errors:
        fail(command, message)
    return 2


def timed_necessity(site_count: int, rows_of: Callable[[], list[Any]]) -> list[dict[str, Any]]:
    """The necessity table's rows from ``rows_of()``, as JSON, with its size, wall time, the
    summary of verdicts and this process's CPU time printed."""
    from overlap_harness.engines.core.report import summary_lines

    started, cpu = time.perf_counter(), time.process_time()
    try:
        rows = rows_of()
    except Interrupted as stop:  # the rows of the sites that finished, as JSON
        print(f"necessity: interrupted after {time.perf_counter() - started:.1f} s wall; "
              f"{len(stop.finished)} rows finished")
        raise Interrupted([row.to_json() for row in stop.finished]) from None
    print(f"necessity: {site_count} sites, {len(rows)} rows, "
          f"{time.perf_counter() - started:.1f} s wall")
    for line in summary_lines(rows):
        print(line)
    print(f"necessity CPU: {time.process_time() - cpu:.1f} s here (children not counted)")
    return [row.to_json() for row in rows]


def fail_written(command: str, message: str, document: dict[str, Any],
                 paths: Sequence[Path]) -> int:
    """:func:`fail` for a tree that cannot be driven at all (it does not import): the JSON
    is still written, ``document`` with the message as its one error and no race, so a CI
    step that reads it finds why; the exit status 2."""
    write_document({**document, "variants": [], "races": [], "errors": [message]}, paths)
    return fail(command, message)


def write_document(document: dict[str, Any], paths: Sequence[Path]) -> None:
    """Write the command's JSON document to each path (its folder made), saying so."""
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {path}")
