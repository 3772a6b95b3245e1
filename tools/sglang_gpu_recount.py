"""Recount a committed GPU report of SGLang's loop from its own trial details (no GPU, nothing
run): the per-row counts a newer harness keeps (``slept_trials``, ``race_made_trials``,
``not_exercised``, ``repro``) and the computed whys, so an older report reads under today's
rules. Usage: ``python tools/sglang_gpu_recount.py reports/conformance/sglang-0.5.23-loop-gpu.json``
(rewrites the .json and its .md beside it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu.table import recounted


def main(path: Path) -> None:
    """Rewrite ``path`` (and the .md beside it) with every row recounted."""
    report = json.loads(path.read_text())
    rows = [recounted(row) for row in report["rows"]]
    fresh = gpu_report.document(
        rows, version=report["sglang_version"], device=report["device"],
        torch_version=report["torch"], date=report["date"], command=report["command"],
        failures=report["child_failures"], seconds=report["seconds"])
    for key in ("runs",):
        if key in report:
            fresh[key] = report[key]
    gpu_report.write(fresh, path.parent)
    print(json.dumps(fresh["summary"]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
