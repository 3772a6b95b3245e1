"""The options every engine command shares (``overlap-harness sglang``, ``vllm``): one tree,
the variants, the necessity table, the JSON and the output folder, the forked children.

Argparse only: the command line builds its parser without importing torch or an engine."""

from __future__ import annotations

import argparse
from pathlib import Path

from overlap_harness.cli_options import count


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
