"""``overlap-harness tokenspeed``: TokenSpeed's own overlap loop (event loop, forward thread,
device handle, model executor), every variant, under the recorder.

Exit 0 when no variant races, 1 when one does, 2 on bad input or when the tree cannot be
driven (TokenSpeed does not import from it, it lacks the forward thread or the device handle,
or a variant's run crashes on an attribute or call the driver did not plan for) with one line
naming what. ``--necessity`` removes every sync site of the driven functions in turn and
prints the table; ``--base`` gives a pull request's view (both trees, each in a child).
"""

from __future__ import annotations

import argparse

from overlap_harness.engines.core.engine_command import (
    EngineCommand,
    add_engine_parser,
    run_engine_command,
)

PROG = "overlap-harness tokenspeed"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``tokenspeed`` subcommand; its handler is ``args.func``."""
    return add_engine_parser(
        subparsers, "tokenspeed",
        "run TokenSpeed's own overlap loop (event loop, forward thread, model executor) under "
        "the recorder (CPU, CUDA faked); --necessity removes each sync site in turn",
        source_help="a directory holding the tokenspeed package (an unzipped wheel, a "
        "checkout or its python/ folder, a site-packages); default: the installed tokenspeed",
        out_help="write tokenspeed.json (and tokenspeed.md with --necessity), and per variant "
        "the timeline plot of one round, Perfetto and SARIF", run=run)


def _load(src: str | None) -> object:
    from overlap_harness.engines.tokenspeed import environment  # deferred: imports torch

    return environment.load(src)


def _necessity() -> object:
    from overlap_harness.engines.tokenspeed import necessity

    return necessity


def _reports() -> object:
    from overlap_harness.engines.tokenspeed import reports

    return reports


def _unavailable() -> type[Exception]:
    from overlap_harness.engines.tokenspeed.errors import TokenSpeedUnavailable

    return TokenSpeedUnavailable


def run(args: argparse.Namespace) -> int:
    """The command: the core's engine run with TokenSpeed's tree, variants and reports."""
    return run_engine_command(args, EngineCommand(
        "tokenspeed", PROG, "TokenSpeed {version}: sync sites of the driven overlap loop",
        _load, _unavailable(), _necessity, _reports))
