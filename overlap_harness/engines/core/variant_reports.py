"""``--out`` of an engine command: per variant, the timeline plot of one iteration, the
Perfetto trace and the SARIF of its run, written by the same writers ``overlap-harness
check`` uses. Engine-neutral: the adapter runs the variant and hands over the recorder's
``Watch``; the plot shows one iteration (the engine's steady state) where the run marked it,
the trace and SARIF hold every race of the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_watch_reports(label: str, watcher: Any, out: Path,
                        plotted_iteration: int | None = None) -> list[Path]:
    """Write the reports of the run ``watcher`` (a finished ``Watch``) under ``out``, named
    ``label``; the plot shows ``plotted_iteration`` (the whole run when None, or when no op
    of the run carries that iteration). Returns the paths written."""
    from overlap_harness.check_cmd import write_reports
    from overlap_harness.model.trace import DeviceRun
    from overlap_harness.recorder.api import CheckResult

    timeline = watcher.run.timeline
    window = None
    if plotted_iteration is not None and any(op.iteration == plotted_iteration
                                             for op in timeline):
        window = (plotted_iteration, plotted_iteration)
        label = f"{label}-iteration-{plotted_iteration}"
    result = CheckResult(label, [], "cpu", races=watcher.races,
                         run=DeviceRun(timeline=timeline, races=watcher.races),
                         buffer_sites=watcher.buffer_sites, marks=watcher.marks,
                         wait_bindings=watcher.wait_bindings)
    return write_reports(result, out, window)
