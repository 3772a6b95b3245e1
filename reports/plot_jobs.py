"""Timeline PNGs drawn by background workers, started before the suite simulates.

Plots were most of a suite's report time: about 0.2 CPU seconds each, 54 of them in the
bundled suite, drawn only once every run had simulated (issue 17 item 2). Here a pool of
worker processes (one per two CPUs) is forked before the first run, each importing
matplotlib and drawing one small figure while the first runs simulate; a racy, faulty or
failing case is handed over the moment its run ends, so the plots are drawn beside the runs.
The workers keep the default priority. A lower one (``os.nice(3)``, the first version) lets
other users' processes starve them on a busy machine, and on idle cores the total CPU sets
the time either way (by that arithmetic; no idle machine was at hand to measure it).

A plot whose inputs (the case's timeline, races, verdict and the plotting code) are those of
the PNG already in the folder is kept, not drawn again: its key sits beside it in
``plots/.keys.json``. The process that owns the pool imports matplotlib only to fork
several workers warm (:func:`_warm_up`), so that each does not pay for it again.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Sequence
from multiprocessing.pool import AsyncResult, Pool
from pathlib import Path
from types import TracebackType

from overlap_harness.model.results import CaseResult
from overlap_harness.reports.file_names import safe_name
from overlap_harness.reports.summary import needs_plot

#: The source of the drawing code: part of every plot's key (read as files, not imported).
TIMELINE_SOURCE = Path(__file__).with_name("timeline.py")
DRAWING_SOURCES = (TIMELINE_SOURCE, TIMELINE_SOURCE.with_name("agg_text.py"),
                   TIMELINE_SOURCE.with_name("race_arrow.py"))
_PLOT_CODE = hashlib.sha1(b"".join(p.read_bytes() for p in DRAWING_SOURCES)).hexdigest()
MAX_WORKERS = 4
"""Plot workers at most: past a few, the suite's runs, not the drawing, set the pace."""
GC_THRESHOLD_0 = 50_000
"""A plot worker's young-generation threshold: a plot allocates some 100,000 objects, and
at the default (2,000) the collector ran dozens of times per plot, a tenth of its time; a
figure's reference cycles are still freed within a plot or two."""


def plot_key(case: CaseResult) -> str:
    """A digest of everything a case's plot shows, and of the code that draws it."""
    shown = (case.name, case.expect, case.verdict, case.ok, case.error, case.removed,
             case.timeline, case.races)
    return hashlib.sha1(pickle.dumps(shown) + _PLOT_CODE.encode()).hexdigest()


def cpu_count() -> int:
    """CPUs this process may run on (its affinity where the OS says, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def draw_png(case: CaseResult, path: str) -> str:
    """Draw ``case``'s timeline and save it as the PNG ``path``; returns ``path``."""
    # deferred: matplotlib (about 0.5 CPU s to import) only where plots are drawn
    from overlap_harness.reports.timeline import plot_timeline, save_plot

    stem = Path(path)
    figure = plot_timeline(case, raster_legend=True, reuse=True)  # saved before the next
    return str(save_plot(figure, stem.with_suffix(""), formats=("png",), dpi=figure.dpi)[0])


_WARM: list[bool] = []  # non-empty once this process (or the one it was forked from) warmed up


def _warm_up() -> None:
    """Import matplotlib and draw once (font loading). A single worker pays this while the
    parent simulates; with several, the parent pays it once before forking them, and each
    worker inherits it instead of paying it again (about 0.6 CPU s per worker, issue 35)."""
    if _WARM:
        return
    # deferred: matplotlib, only where plots are drawn
    from overlap_harness.reports.timeline import agg_figure

    _WARM.append(True)
    fig = agg_figure(2, 1)
    ax = fig.subplots()
    ax.text(0.5, 0.5, "warm-up", fontsize=7)
    ax.set_title("warm-up", fontsize=10)
    fig.savefig(io.BytesIO(), format="png", dpi=100)
    del fig, ax


def _start_worker() -> None:
    """Pool initializer: leave Ctrl-C to the parent, warm matplotlib up (:func:`_warm_up`;
    a no-op past the first time in a process), then take what is loaded out of the garbage
    collector's view (``gc.freeze``) and let it run less often (:data:`GC_THRESHOLD_0`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _warm_up()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD_0, *gc.get_threshold()[1:])


class PlotJobs:
    """The PNG timelines of one report folder: offered case by case, collected at the end.

    ``workers`` processes are forked at construction (0: every plot is drawn in this process
    when :meth:`finish` is called). Use as a context manager, or call :meth:`close`, so no
    worker outlives an error.
    """

    def __init__(self, plot_dir: Path, workers: int = 0) -> None:
        self.plot_dir = plot_dir
        plot_dir.mkdir(parents=True, exist_ok=True)
        self._keys_path = plot_dir / ".keys.json"
        try:
            self._old_keys: dict[str, str] = json.loads(self._keys_path.read_text())
        except (OSError, ValueError):
            self._old_keys = {}
        self._keys_path.unlink(missing_ok=True)  # a crash while drawing must not leave stale keys
        self._keys: dict[str, str] = {}
        self._paths: dict[str, Path] = {}
        self._waiting: list[tuple[CaseResult, AsyncResult | None]] = []
        self._pool: Pool | None = None
        if workers > 0 and "fork" in multiprocessing.get_all_start_methods():
            # fork: the workers inherit every module already imported (torch included), so
            # starting one costs milliseconds; each case is pickled to it (tens of kB)
            if workers > 1:
                _warm_up()  # once here, inherited by every worker, not once per worker
            self._pool = multiprocessing.get_context("fork").Pool(workers, _start_worker)

    def offer(self, case: CaseResult) -> None:
        """Plot ``case`` if it needs one (racy, faulty or failing) and its PNG is not already
        in the folder with the same key; in a worker when there is a pool."""
        if not needs_plot(case):
            return
        key = plot_key(case)
        path = self.plot_dir / f"{safe_name(case.run_id)}.png"
        self._keys[case.run_id] = key
        self._paths[case.run_id] = path
        if self._old_keys.get(case.run_id) == key and path.exists():
            return
        job = None if self._pool is None else self._pool.apply_async(draw_png, (case, str(path)))
        self._waiting.append((case, job))

    def finish(self, progress: Callable[[int, int, str], None] | None = None
               ) -> dict[str, Path]:
        """Wait for (or draw) every plot offered; write the keys; run id -> PNG path."""
        waiting, self._waiting = self._waiting, []
        for i, (case, job) in enumerate(waiting):
            if progress is not None:
                progress(i, len(waiting), f"plot {case.name}")
            if job is None:
                draw_png(case, str(self._paths[case.run_id]))
            else:
                job.get()
        if progress is not None:
            progress(len(waiting), len(waiting), "")
        self.close()
        self._keys_path.write_text(json.dumps(self._keys, indent=0, sort_keys=True))
        return dict(self._paths)

    def close(self) -> None:
        """Stop the workers (at once if plots are still being drawn)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> PlotJobs:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


def workers_beside_runs(cpus: int) -> int:
    """Plot workers that draw while the runs simulate on ``cpus`` CPUs: one per two CPUs,
    at least one, at most :data:`MAX_WORKERS`. The suite's plots take about two thirds of
    the CPU its runs take, and the runs use every CPU; each worker pays matplotlib's import
    (about 0.45 CPU s) and renders its own copy of each string, so on 2 CPUs a second
    worker cost more CPU than it saved time (issue 17 item 2)."""
    return max(1, min(MAX_WORKERS, cpus // 2))


def start_plots(plot_dir: Path) -> PlotJobs:
    """Plot workers for ``plot_dir`` (:func:`workers_beside_runs`), started now, before
    the suite simulates: offer each case as its run ends, then pass the jobs to
    :func:`overlap_harness.reports.writer.write_all`. Importing this module loads neither
    torch nor matplotlib, so the workers can be forked before either."""
    return PlotJobs(plot_dir, workers_beside_runs(cpu_count()))


def plot_all(cases: Sequence[CaseResult], plot_dir: Path, workers: int = 0,
             progress: Callable[[int, int, str], None] | None = None) -> dict[str, Path]:
    """The PNG of each case that needs one, run id -> path (kept when unchanged)."""
    with PlotJobs(plot_dir, workers) as jobs:
        for case in cases:
            jobs.offer(case)
        return jobs.finish(progress)
