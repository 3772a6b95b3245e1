"""Write every report of a suite run into one folder.

Layout of ``out_dir``: ``summary.html`` and ``summary.md`` (open these), ``plots/<run>.png``
and ``.svg`` for each racy, faulty or failing run, ``trace.json`` (Perfetto / Chrome trace),
``junit.xml``, ``results.sarif``, ``results.json`` (with timelines), and ``scenarios/<name>.json``,
each scenario's resolved configuration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from model.results import CaseResult
from reports.jsonout import to_json
from reports.junit import write_junit
from reports.perfetto import write_trace
from reports.sarif import write_sarif
from reports.summary import latest_gpu_report, needs_plot, to_html, to_markdown
from reports.timeline import plot_timeline, save_plot

GPU_DIR = Path(__file__).resolve().parent / "gpu"


def safe_name(run_id: str) -> str:
    """A file-system-safe stem for a run id (``scenario/mutation-hash``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)


def write_all(
    results: Sequence[CaseResult],
    out_dir: str | Path,
    necessity_rows: Sequence[Sequence[str]] = (),
    gpu_dir: Path | None = GPU_DIR,
    progress: Callable[[int, int, str], None] | None = None,
) -> Path:
    """Write all reports of ``results`` under ``out_dir``; returns the HTML summary's path."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    (out / "scenarios").mkdir(exist_ok=True)
    to_plot = [r for r in results if needs_plot(r) and r.timeline]
    plots: dict[str, Path] = {}
    for i, r in enumerate(to_plot):
        if progress is not None:
            progress(i, len(to_plot), f"plot {r.name}")
        stem = out / "plots" / safe_name(r.run_id)
        plots[r.run_id] = save_plot(plot_timeline(r), stem)[0]
    if progress is not None:
        progress(len(to_plot), len(to_plot), "")
    for r in results:
        if r.config:
            (out / "scenarios" / f"{safe_name(r.run_id)}.json").write_text(
                json.dumps(r.config, indent=1, default=str) + "\n")
    write_trace(results, str(out / "trace.json"))
    write_junit(results, out / "junit.xml")
    write_sarif(results, out / "results.sarif")
    (out / "results.json").write_text(to_json(results, with_timeline=True))
    gpu = latest_gpu_report(gpu_dir) if gpu_dir is not None else None
    rel = {k: str(v.relative_to(out)) for k, v in plots.items()}
    (out / "summary.md").write_text(to_markdown(results, rel, necessity_rows, gpu))
    html_path = out / "summary.html"
    html_path.write_text(to_html(results, plots, necessity_rows, gpu))
    return html_path
