"""``overlap-harness conformance``: SGLang's real FutureMap beside the model, as a report.

Wired by ``overlap_harness/cli.py`` through :func:`add_parser` (that file is not this
package's to edit). Exit 0 when every unmodified run is race-free (a mutation a variant does
not catch is explained in the report), 1 otherwise, 2 when sglang 0.5.23 is not
importable (one line, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from overlap_harness.output_paths import prepare_outputs

DEFAULT_OUT = Path("reports/conformance")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``conformance`` subcommand; its handler is ``args.func``."""
    parser = subparsers.add_parser(
        "conformance", help="run SGLang 0.5.23's FutureMap under the recorder and compare "
        "with the model (needs the sglang extra)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help="folder for sglang-0.5.23.json and .md (default %(default)s)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run every variant and mutation, write the report, print where it is. The output
    folder is prepared first (:func:`overlap_harness.output_paths.prepare_outputs`), before
    sglang is looked for."""
    prepare_outputs(folders={"--out": args.out})
    # deferred: sglang_env imports the recorder and torch; the command line starts without them
    from overlap_harness.conformance.sglang_env import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        print(f"overlap-harness conformance: {reason}", file=sys.stderr)
        return 2
    from overlap_harness.conformance.report import generate  # deferred: imports sglang (~5 s)

    json_path, md_path = generate(args.out)
    print(f"wrote {json_path} and {md_path}")
    rows = json.loads(json_path.read_text())["rows"]
    racy_unmodified = [r for r in rows if r["mutation"] is None and r["races"]]
    return 1 if racy_unmodified else 0
