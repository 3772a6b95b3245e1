"""Write docs/sglang-releases.md: what changed in SGLang's overlap path between releases.

Two parts, both computed here and never edited by hand:
- the syncs added, removed or moved out of the path between consecutive releases, read from
  each release's own files (:mod:`overlap_harness.engines.sglang.report.release_diff`; the trees are
  fetched into the user's cache: :mod:`overlap_harness.engines.sglang.releases`);
- the sites whose necessity verdict changed, from the committed loop reports
  (reports/conformance/sglang-VERSION-loop.json, written by
  ``overlap-harness sglang --necessity --loop-report``) of the releases that have one.

Usage: ``python tools/sglang_releases_page.py [--out docs/sglang-releases.md] [VERSION ...]``
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import pairwise
from pathlib import Path

from overlap_harness.engines.sglang import releases
from overlap_harness.engines.sglang.report.release_diff import (
    compare,
    markdown,
    necessity_changes,
    tree_sites,
)

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports" / "conformance"

_HEAD = """# SGLang releases: what changed in the overlap path

Written by `python tools/sglang_releases_page.py` (do not edit by hand). For every supported
release, `overlap-harness sglang --sglang-src TREE` drives SGLang's own loop (the release
matrix: `pytest -m slow tests/engines/test_sglang_release_matrix.py`). This page is what a
reviewer of SGLang reads: which syncs of the overlap path each release added or removed, and
where the necessity table's verdict for the same sync changed.

A sync is matched across releases by its module, function, kind and statement text, not by
its line, so code that only moved is not listed; a renamed function or variable shows as one
removal and one addition. The path's modules are those the driven loop runs
(`overlap_harness/engines/sglang/report/path_sites.py`).

## Syncs added and removed
"""


def _verdict_section(versions: list[str]) -> list[str]:
    lines = ["## Necessity verdicts that changed", ""]
    reported = [v for v in versions if (REPORTS / f"sglang-{v}-loop.json").is_file()]
    lines.append("Releases with a committed loop report: "
                 + (", ".join(reported) if reported else "none") + ".")
    lines.append("")
    for old, new in pairwise(reported):
        rows = [json.loads((REPORTS / f"sglang-{v}-loop.json").read_text())["rows"]
                for v in (old, new)]
        changes = necessity_changes(*rows)
        lines.append(f"### {old} → {new}")
        lines.append("")
        if not changes:
            lines += ["No verdict changed for a sync both releases have, in a variant both "
                      "ran.", ""]
            continue
        lines += ["| variant | function | sync | " + old + " | " + new + " |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c.variant} | `{c.function}` | `{c.code}` | {c.older} | {c.newer} |"
                  for c in changes]
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Fetch the trees, compare them, write the page; 2 when a release cannot be fetched."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(releases.SUPPORTED))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "sglang-releases.md")
    args = parser.parse_args(argv)
    try:
        trees = [tree_sites(releases.release_tree(v)) for v in args.versions]
    except releases.ReleaseUnavailable as exc:
        print(f"sglang_releases_page: {exc}", file=sys.stderr)
        return 2
    changes = [compare(old, new) for old, new in pairwise(trees)]
    text = _HEAD + "\n" + markdown(args.versions, changes) + "\n" + "\n".join(
        _verdict_section(args.versions)) + "\n"
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
