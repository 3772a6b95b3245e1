"""Write every report of a suite run into one folder.

Layout of ``out_dir``: ``summary.html`` and ``summary.md`` (open these), ``plots/<run>.png``
for each racy, faulty or failing run (a run the harness refused shows its error),
``trace.json`` (Perfetto / Chrome trace), ``junit.xml``, ``results.sarif``, ``results.json``
(with timelines), and ``scenarios/<name>.json``, each scenario's resolved configuration. A
trace or results file over 8 MB is written as ``.json.gz`` instead (Perfetto opens the
gzip as it is; ``python -m gzip -d`` or ``zcat`` for the rest).

The default folder, :data:`DEFAULT_OUT`, is ``overlap-reports/`` in the working directory:
reports are the user's files, not part of the ``reports`` package's sources.

Plots are most of the time (a figure per racy run). A plot whose inputs (the case's
timeline, races, verdict and the plotting code) are those of the PNG already in the folder is
kept, not drawn again (its key sits beside it in ``plots/.keys.json``); with more than a few
to draw they are drawn by worker processes forked from this one (they inherit the results,
nothing is pickled), as many as there are CPUs, at most four.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import multiprocessing
import os
import pickle
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from overlap_harness.model.results import CaseResult
from overlap_harness.reports import DEFAULT_OUT
from overlap_harness.reports import timeline as _timeline_module
from overlap_harness.reports.jsonout import to_json
from overlap_harness.reports.junit import write_junit
from overlap_harness.reports.perfetto import write_trace
from overlap_harness.reports.sarif import write_sarif
from overlap_harness.reports.summary import latest_gpu_report, needs_plot, to_html, to_markdown
from overlap_harness.reports.timeline import plot_timeline, save_plot

GPU_DIR = Path(__file__).resolve().parent / "gpu"
GZIP_OVER_BYTES = 8 << 20
"""A results file larger than this is written gzip-compressed."""
PARALLEL_FROM = 6
"""Fewer plots than this are drawn in this process (a worker costs about 0.1 s to start)."""

_PENDING: Sequence[CaseResult] = ()  # what forked plot workers read, by index
_PLOT_CODE = hashlib.sha1(Path(_timeline_module.__file__).read_bytes()).hexdigest()


def safe_name(run_id: str) -> str:
    """A file-system-safe stem for a run id (``scenario/mutation-hash``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", run_id)


def write_text(path: Path, text: str, gzip_over: int = GZIP_OVER_BYTES) -> Path:
    """Write ``text`` to ``path``, or gzip-compressed to ``path.gz`` when it is larger than
    ``gzip_over`` bytes; removes a stale file of the other name. Returns the path written."""
    packed = path.with_name(path.name + ".gz")
    if len(text) > gzip_over:
        with gzip.open(packed, "wt", compresslevel=1) as f:
            f.write(text)
        path.unlink(missing_ok=True)
        return packed
    path.write_text(text)
    packed.unlink(missing_ok=True)
    return path


def _plot_one(index: int, plot_dir: str) -> str:
    """Draw and save the PNG of ``_PENDING[index]``; returns its path (run in a worker)."""
    case = _PENDING[index]
    stem = Path(plot_dir) / safe_name(case.run_id)
    return str(save_plot(plot_timeline(case), stem, formats=("png",))[0])


def _workers(count: int) -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(4, cpus or 1, count)


def plot_key(case: CaseResult) -> str:
    """A digest of everything a case's plot shows, and of the code that draws it."""
    shown = (case.name, case.expect, case.verdict, case.ok, case.error, case.removed,
             case.timeline, case.races)
    return hashlib.sha1(pickle.dumps(shown) + _PLOT_CODE.encode()).hexdigest()


def write_plots(cases: Sequence[CaseResult], plot_dir: Path,
                progress: Callable[[int, int, str], None] | None = None) -> dict[str, Path]:
    """The PNG timeline of each case, run id -> path: kept when unchanged, else drawn (in
    forked workers when it pays)."""
    plot_dir.mkdir(parents=True, exist_ok=True)
    keys_path = plot_dir / ".keys.json"
    try:
        old_keys = json.loads(keys_path.read_text())
    except (OSError, ValueError):
        old_keys = {}
    keys = {case.run_id: plot_key(case) for case in cases}
    done = {case.run_id: plot_dir / f"{safe_name(case.run_id)}.png" for case in cases}
    todo = [case for case in cases if old_keys.get(case.run_id) != keys[case.run_id]
            or not done[case.run_id].exists()]
    keys_path.unlink(missing_ok=True)  # a crash while drawing must not leave stale keys
    done.update(_draw(todo, plot_dir, progress))
    keys_path.write_text(json.dumps(keys, indent=0, sort_keys=True))
    return done


def _draw(cases: Sequence[CaseResult], plot_dir: Path,
          progress: Callable[[int, int, str], None] | None) -> dict[str, Path]:
    """Draw each case's PNG, in forked workers when there are enough of them."""
    global _PENDING
    workers = _workers(len(cases))
    _PENDING = cases
    try:
        if workers < 2 or len(cases) < PARALLEL_FROM or "fork" not in (
                multiprocessing.get_all_start_methods()):
            paths = []
            for i, case in enumerate(cases):
                if progress is not None:
                    progress(i, len(cases), f"plot {case.name}")
                paths.append(_plot_one(i, str(plot_dir)))
        else:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                pending = [pool.apply_async(_plot_one, (i, str(plot_dir)))
                           for i in range(len(cases))]
                paths = []
                for i, job in enumerate(pending):
                    if progress is not None:
                        progress(i, len(cases), f"plot {cases[i].name}")
                    paths.append(job.get())
    finally:
        _PENDING = ()
    if progress is not None:
        progress(len(cases), len(cases), "")
    return {case.run_id: Path(p) for case, p in zip(cases, paths, strict=True)}


def write_all(
    results: Sequence[CaseResult],
    out_dir: str | Path = DEFAULT_OUT,
    necessity_rows: Sequence[Sequence[str]] = (),
    gpu_dir: Path | None = GPU_DIR,
    progress: Callable[[int, int, str], None] | None = None,
) -> Path:
    """Write all reports of ``results`` under ``out_dir``; returns the HTML summary's path."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    (out / "scenarios").mkdir(exist_ok=True)
    plots = write_plots([r for r in results if needs_plot(r)], out / "plots", progress)
    for r in results:
        if r.config:
            (out / "scenarios" / f"{safe_name(r.run_id)}.json").write_text(
                json.dumps(r.config, indent=1, default=str) + "\n")
    write_trace(results, out / "trace.json")
    write_junit(results, out / "junit.xml")
    write_sarif(results, out / "results.sarif")
    write_text(out / "results.json", to_json(results, with_timeline=True))
    gpu = latest_gpu_report(gpu_dir) if gpu_dir is not None else None
    rel = {k: str(v.relative_to(out)) for k, v in plots.items()}
    (out / "summary.md").write_text(to_markdown(results, rel, necessity_rows, gpu))
    html_path = out / "summary.html"
    html_path.write_text(to_html(results, plots, necessity_rows, gpu))
    return html_path
