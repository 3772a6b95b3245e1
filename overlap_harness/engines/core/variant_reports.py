"""``--out`` of an engine command: per variant, the timeline plot of one iteration, the
Perfetto trace and the SARIF of its run, written by the same writers ``overlap-harness
check`` uses. Engine-neutral: the adapter runs the variant and hands over the recorder's
``Watch``; the plot shows one iteration (the engine's steady state) where the run marked it,
the trace and SARIF hold every race of the run.

Files are named as the command's text and JSON name them
(:func:`~overlap_harness.engines.core.results.name_files_relative_to`): the engine's files
from the tree's root, the harness's from its checkout, in every source line of the trace,
every location and message of the SARIF (whose ``%SRCROOT%`` is then the tree's root) and
every loop the messages name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any


def write_watch_reports(label: str, watcher: Any, out: Path,
                        plotted_iteration: int | None = None) -> list[Path]:
    """Write the reports of the run ``watcher`` (a finished ``Watch``) under ``out``, named
    ``label``; the plot shows ``plotted_iteration`` (the whole run when None, or when no op
    of the run carries that iteration). Returns the paths written."""
    from overlap_harness.check_cmd import write_reports
    from overlap_harness.engines.core.results import files_root
    from overlap_harness.model.trace import DeviceRun
    from overlap_harness.recorder.api import CheckResult

    timeline, races = watcher.run.timeline, watcher.races
    sites, marks = watcher.buffer_sites, watcher.marks
    root = files_root()
    if root is not None:
        timeline, races, sites, marks = _shown(timeline, races, sites, marks)
    window = None
    if plotted_iteration is not None and any(op.iteration == plotted_iteration
                                             for op in timeline):
        window = (plotted_iteration, plotted_iteration)
        label = f"{label}-iteration-{plotted_iteration}"
    result = CheckResult(label, [], "cpu", races=races,
                         run=DeviceRun(timeline=timeline, races=races),
                         buffer_sites=sites, marks=marks,
                         wait_bindings=watcher.wait_bindings)
    return write_reports(result, out, window,
                         source_root=None if root is None else Path(root))


def _shown(timeline: list[Any], races: list[Any], sites: dict[str, str],
           marks: dict[int, Any]) -> tuple[list[Any], list[Any], dict[str, str],
                                           dict[int, Any]]:
    """The run's records with every file named by :func:`.results.shown_site` (ops' and
    accesses' sources, buffers' allocation sites, the loops of iteration marks)."""
    from overlap_harness.engines.core.results import shown_file, shown_site

    timeline = [replace(op, source=shown_site(op.source)) for op in timeline]
    races = [replace(race, first=replace(race.first, source=shown_site(race.first.source)),
                     second=replace(race.second, source=shown_site(race.second.source)))
             for race in races]
    sites = {name: shown_site(site) for name, site in sites.items()}
    marks = {op: replace(mark, loops=tuple(replace(loop, file=shown_file(loop.file))
                                           for loop in mark.loops))
             for op, mark in marks.items()}
    return timeline, races, sites, marks
