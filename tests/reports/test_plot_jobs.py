"""Plots drawn by background workers while a suite simulates (issue 17 item 2).

The workers are forked before the first run and handed each case as its run ends; what they
draw must be the PNG the same code draws in this process, only for the cases that need a
plot, and the process that owns them must never import matplotlib.
"""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from matplotlib.text import Annotation

from overlap_harness.reports import plot_jobs, race_connectors, timeline, writer
from overlap_harness.reports.plot_jobs import PlotJobs, plot_all
from overlap_harness.reports.timeline import plot_timeline
from overlap_harness.runner import run_scenarios
from overlap_harness.scenarios.loader import load_paths
from tests.reports.conftest import make_case

REPO = Path(__file__).resolve().parents[2]


def racy_cases(tmp_path: Path, count: int) -> list:
    case = make_case(tmp_path, mutation="no_publish_wait")
    return [dataclasses.replace(case, run_id=f"synthetic_decode/no_publish_wait-{i}")
            for i in range(count)]


def test_workers_draw_the_png_this_process_draws(tmp_path) -> None:
    cases = racy_cases(tmp_path, 3)
    here = plot_all(cases, tmp_path / "here", workers=0)
    with PlotJobs(tmp_path / "workers", workers=2) as jobs:
        for case in cases:
            jobs.offer(case)
        there = jobs.finish()
    assert list(here) == list(there) == [c.run_id for c in cases]
    for run_id in here:
        assert here[run_id].read_bytes() == there[run_id].read_bytes()
        assert there[run_id].read_bytes().startswith(b"\x89PNG")


def test_only_racy_faulty_or_failing_cases_get_a_plot(tmp_path) -> None:
    base = make_case(tmp_path)  # race-free and ok: no plot
    racy = make_case(tmp_path, mutation="no_publish_wait")
    failing = dataclasses.replace(base, run_id="synthetic_decode/failing", ok=False)
    plots = plot_all([base, racy, failing], tmp_path / "plots")
    assert sorted(plots) == sorted([racy.run_id, failing.run_id])
    assert not (tmp_path / "plots" / f"{plot_jobs.safe_name(base.run_id)}.png").exists()


def test_a_pool_closed_before_finish_leaves_no_keys_and_no_workers(tmp_path) -> None:
    jobs = PlotJobs(tmp_path / "plots", workers=2)
    for case in racy_cases(tmp_path, 2):
        jobs.offer(case)
    jobs.close()  # what an error in the runs does (the command line's finally)
    assert jobs._pool is None and not (tmp_path / "plots" / ".keys.json").exists()


def test_the_process_owning_the_workers_never_imports_matplotlib(tmp_path) -> None:
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from tests.reports.conftest import make_case
        from overlap_harness.reports.plot_jobs import start_plots
        from overlap_harness.reports.writer import write_all
        tmp = Path({str(tmp_path)!r})
        case = make_case(tmp, mutation="no_publish_wait")
        jobs = start_plots(tmp / "out" / "plots")
        jobs.offer(case)
        write_all([case], tmp / "out", gpu_dir=None, plots=jobs)
        assert (tmp / "out" / "plots" / (case.run_id.replace("/", "_") + ".png")).exists()
        print("matplotlib" in sys.modules, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False True"  # torch: the synthetic case was simulated


def test_each_result_is_handed_over_as_its_run_ends() -> None:
    scenarios = load_paths([REPO / "scenarios" / "protocol" / "s01_stash_gather_fifo.toml"])
    seen: list = []
    results = run_scenarios(scenarios, on_result=seen.append)
    assert len(results) > 1 and [r.run_id for r in seen] == [r.run_id for r in results]


def rgba(figure) -> np.ndarray:
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba()).copy()


def test_the_pasted_legend_is_the_legend_pixel_for_pixel(tmp_path) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    drawn = plot_timeline(case)
    pasted = plot_timeline(case, raster_legend=True)
    assert len(drawn.legends) == 1 and not pasted.legends and len(pasted.images) == 1
    drawn_pixels, pasted_pixels = rgba(drawn), rgba(pasted)
    assert drawn_pixels.shape == pasted_pixels.shape
    assert (drawn_pixels == pasted_pixels).all()
    no_legend = plot_timeline(case, raster_legend=True)
    no_legend.images.clear()  # the twin: without the pasted pixels the picture differs
    assert (rgba(no_legend) != drawn_pixels).any()


def test_a_figure_of_another_size_gets_its_own_legend_pixels(tmp_path) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    for width_in in (12.345, 20.8):
        drawn = plot_timeline(case, width_in=width_in)
        pasted = plot_timeline(case, width_in=width_in, raster_legend=True)
        assert (rgba(drawn) == rgba(pasted)).all()


def annotation_arrow(start: tuple[float, float], end: tuple[float, float]) -> Annotation:
    """The race connector as it was drawn before: an annotation with empty text."""
    return Annotation("", xy=end, xytext=start, zorder=6,
                      arrowprops={"arrowstyle": "-|>", "color": timeline.RACE_COLOR,
                                  "lw": 1.6, "connectionstyle": "arc3,rad=0.15"})


@pytest.mark.parametrize("window", [None, (1, 1)])  # (1, 1): some heads outside the axes
def test_race_connectors_are_the_annotation_arrows(tmp_path, monkeypatch, window) -> None:
    case = make_case(tmp_path, iterations=4, mutation="no_publish_wait")
    assert case.races
    connectors = rgba(plot_timeline(case, window=window)).astype(int)
    monkeypatch.setattr(race_connectors, "RaceArrow", annotation_arrow)
    annotations = rgba(plot_timeline(case, window=window)).astype(int)
    # the ends are shrunk in closed form (reports/race_arrow.py), matplotlib bisects them
    # to 0.01 px: anti-aliasing may move by a level or two, no more
    assert np.abs(connectors - annotations).max() <= 2
    without = plot_timeline(case, window=window)
    for artist in list(without.axes[0].texts):
        if isinstance(artist, Annotation) and not artist.get_text():
            artist.remove()  # the twin: no connectors, another picture
    assert np.abs(rgba(without) - annotations).max() > 100


def test_the_side_reports_are_written_beside_results_json(tmp_path) -> None:
    case = make_case(tmp_path, mutation="no_publish_wait")
    writer.write_all([case], tmp_path / "out", gpu_dir=None)
    for name in ("trace.json", "junit.xml", "results.sarif", "results.json", "summary.html",
                 f"scenarios/{plot_jobs.safe_name(case.run_id)}.json"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name


def test_a_failing_side_report_fails_the_writer(tmp_path, monkeypatch) -> None:
    def broken(cases, path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(writer, "write_sarif", broken)  # the forked process inherits it
    case = make_case(tmp_path, mutation="no_publish_wait")
    with pytest.raises(RuntimeError, match="SARIF and scenario reports failed"):
        writer.write_all([case], tmp_path / "out", gpu_dir=None)


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (64, 4)])
def test_one_plot_worker_per_two_cpus_beside_the_runs(cpus, workers) -> None:
    assert plot_jobs.workers_beside_runs(cpus) == workers


def test_a_worker_collects_garbage_less_often_and_not_what_it_loaded(tmp_path) -> None:
    with PlotJobs(tmp_path / "plots", workers=1) as jobs:
        threshold = jobs._pool.apply(gc.get_threshold)
        frozen = jobs._pool.apply(gc.get_freeze_count)
    assert threshold[0] == plot_jobs.GC_THRESHOLD_0 != gc.get_threshold()[0]
    assert frozen > 10_000  # matplotlib's modules and the warm-up figure's fonts


def test_a_reused_figure_draws_what_a_new_one_draws(tmp_path) -> None:
    racy = make_case(tmp_path, mutation="no_publish_wait")
    other = make_case(tmp_path, mutation="no_publish_wait", iterations=4)
    fresh = rgba(plot_timeline(other, raster_legend=True))
    timeline._kept.clear()
    first = plot_timeline(racy, raster_legend=True, reuse=True)
    racy_pixels = rgba(first)
    second = plot_timeline(other, raster_legend=True, reuse=True)
    assert second is first  # the same layout: drawn on the kept figure, emptied
    assert (rgba(second) == fresh).all()
    assert (racy_pixels != fresh).any()  # the twin: the first plot was another picture
