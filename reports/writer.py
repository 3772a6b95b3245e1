"""Write every report of a suite run into one folder.

Layout of ``out_dir``: ``summary.html`` and ``summary.md`` (open these), ``plots/<run>.png``
for each racy, faulty or failing run (a run the harness refused shows its error),
``trace.json`` (Perfetto / Chrome trace), ``junit.xml``, ``results.sarif``, ``results.json``
(with timelines), and ``scenarios/<name>.json``, each scenario's resolved configuration. A
trace or results file over 8 MB is written as ``.json.gz`` instead (Perfetto opens the
gzip as it is; ``python -m gzip -d`` or ``zcat`` for the rest).

The default folder, :data:`DEFAULT_OUT`, is ``overlap-reports/`` in the working directory:
reports are the user's files, not part of the ``reports`` package's sources.

Plots are most of the time (a figure per racy run): :mod:`overlap_harness.reports.plot_jobs`
draws them in forked workers, kept when unchanged. The command line starts those workers
before the suite simulates and hands each case over as its run ends (``start_plots``
there); otherwise :func:`write_all` starts them itself. Nothing here imports matplotlib:
only the plot workers do.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
from collections.abc import Callable, Sequence
from pathlib import Path

from overlap_harness.model.results import CaseResult
from overlap_harness.reports import DEFAULT_OUT
from overlap_harness.reports.file_names import safe_name as safe_name
from overlap_harness.reports.jsonout import to_json
from overlap_harness.reports.junit import write_junit
from overlap_harness.reports.perfetto import write_trace
from overlap_harness.reports.plot_jobs import MAX_WORKERS, PlotJobs, cpu_count, plot_all
from overlap_harness.reports.plot_jobs import plot_key as plot_key
from overlap_harness.reports.sarif import write_sarif
from overlap_harness.reports.summary import latest_gpu_report, needs_plot, to_html, to_markdown

GPU_DIR = Path(__file__).resolve().parent / "gpu"
GZIP_OVER_BYTES = 8 << 20
"""A results file larger than this is written gzip-compressed."""
PARALLEL_FROM = 6
"""Fewer plots than this are drawn in this process (a worker costs about 0.1 s to start)."""


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


def _workers(count: int) -> int:
    """Plot workers for ``count`` plots: one per CPU, at most :data:`MAX_WORKERS`."""
    return min(MAX_WORKERS, cpu_count(), count)


def write_plots(cases: Sequence[CaseResult], plot_dir: Path,
                progress: Callable[[int, int, str], None] | None = None) -> dict[str, Path]:
    """The PNG timeline of each case, run id -> path: kept when unchanged, else drawn (in
    forked workers from :data:`PARALLEL_FROM` plots on)."""
    return plot_all(cases, plot_dir, _plot_workers(len(cases)), progress)


def _plot_workers(count: int) -> int:
    """Workers for ``count`` plots drawn after the runs: none under :data:`PARALLEL_FROM`
    plots or when only one would start (this process draws them then)."""
    workers = _workers(count) if count >= PARALLEL_FROM else 0
    return workers if workers >= 2 else 0


def _write_side_reports(results: Sequence[CaseResult], out: Path) -> None:
    """The reports no other file refers to: each run's configuration, the Perfetto trace,
    JUnit and SARIF."""
    for r in results:
        if r.config:
            (out / "scenarios" / f"{safe_name(r.run_id)}.json").write_text(
                json.dumps(r.config, indent=1, default=str) + "\n")
    write_trace(results, out / "trace.json")
    write_junit(results, out / "junit.xml")
    write_sarif(results, out / "results.sarif")


def _start_side_reports(results: Sequence[CaseResult], out: Path
                        ) -> multiprocessing.process.BaseProcess | None:
    """:func:`_write_side_reports` in a forked process (it inherits the results: nothing is
    pickled), so they are written beside results.json and the plots, on another core once
    the runs are done (issue 17 item 2); without fork, here, and None."""
    if "fork" not in multiprocessing.get_all_start_methods():
        _write_side_reports(results, out)
        return None
    side = multiprocessing.get_context("fork").Process(
        target=_write_side_reports, args=(results, out), name="overlap-harness side reports")
    side.start()
    return side


def _join_side_reports(side: multiprocessing.process.BaseProcess | None) -> None:
    """Wait for the side reports; a failure there is an error here (its traceback is on
    stderr already)."""
    if side is None:
        return
    side.join()
    if side.exitcode != 0:
        raise RuntimeError(f"writing the trace, JUnit, SARIF and scenario reports failed "
                           f"(exit status {side.exitcode}; traceback above)")


def write_all(
    results: Sequence[CaseResult],
    out_dir: str | Path = DEFAULT_OUT,
    necessity_rows: Sequence[Sequence[str]] = (),
    gpu_dir: Path | None = GPU_DIR,
    progress: Callable[[int, int, str], None] | None = None,
    plots: PlotJobs | None = None,
) -> Path:
    """Write all reports of ``results`` under ``out_dir``; returns the HTML summary's path.

    ``plots``: the jobs of :func:`~overlap_harness.reports.plot_jobs.start_plots` for
    this folder's ``plots/``, every case of ``results``
    already offered; without them they are drawn here (:func:`write_plots`). The text
    reports are written while the plot workers draw: results.json here, the rest in a
    forked process."""
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    (out / "scenarios").mkdir(exist_ok=True)
    if plots is None:
        plots = PlotJobs(out / "plots", _plot_workers(sum(map(needs_plot, results))))
        for r in results:
            plots.offer(r)
    side = _start_side_reports(results, out)
    try:
        write_text(out / "results.json", to_json(results, with_timeline=True))
        pngs = plots.finish(progress)
    except BaseException:  # Ctrl-C or an error here: stop the side process, say this one
        if side is not None:
            side.terminate()
            side.join()
        raise
    _join_side_reports(side)
    gpu = latest_gpu_report(gpu_dir) if gpu_dir is not None else None
    rel = {k: str(v.relative_to(out)) for k, v in pngs.items()}
    (out / "summary.md").write_text(to_markdown(results, rel, necessity_rows, gpu))
    html_path = out / "summary.html"
    html_path.write_text(to_html(results, pngs, necessity_rows, gpu))
    return html_path
