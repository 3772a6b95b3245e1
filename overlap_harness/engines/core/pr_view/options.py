"""The options of a pull request's view, added to an engine command (light: no engine or
torch import)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_pr_options(parser: argparse.ArgumentParser, engine: str) -> None:
    """Add ``--base``, ``--allow-unreached`` and ``--sarif`` to an engine command."""
    parser.add_argument("--base", metavar="TREE|REV", default=None,
                        help=f"compare --{engine}-src (a pull request's head) with its base: "
                        "a second tree, or a git revision of the head's checkout; reports new "
                        "races attributed to the changed lines, races fixed, the changed "
                        "lines each variant ran (docs/pull-requests.md)")
    parser.add_argument("--allow-unreached", action="store_true",
                        help="with --base: exit 0, not 2, when changed stream-ordering lines "
                        "were run by no variant")
    parser.add_argument("--sarif", type=Path, metavar="FILE", default=None,
                        help="with --base: write the new races and unreached lines as SARIF, "
                        "located at the changed lines")
