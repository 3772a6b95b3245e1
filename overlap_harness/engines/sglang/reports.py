"""``--out``: the timeline plot of one iteration of SGLang's real streams, the Perfetto trace
and SARIF of each variant's run, written by the same writers ``overlap-harness check`` uses."""

from __future__ import annotations

from pathlib import Path

from overlap_harness.model.trace import DeviceRun

#: the iteration the plot shows: the loop is in its steady state (a batch in flight, the
#: previous one being processed) from the third iteration on
PLOTTED_ITERATION = 3


def write_variant_reports(variant_name: str, out: Path) -> list[Path]:
    """Run ``variant_name`` once more (SGLang loaded) and write its reports under ``out``."""
    from overlap_harness.check_cmd import write_reports
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.variants import VARIANTS
    from overlap_harness.recorder.api import CheckResult

    run = run_variant(VARIANTS[variant_name])
    timeline = [op for op in run.watch.run.timeline if op.iteration == PLOTTED_ITERATION]
    result = CheckResult(f"sglang-{variant_name}-iteration-{PLOTTED_ITERATION}", [], "cpu",
                         races=run.races, run=DeviceRun(timeline=timeline, races=run.races))
    return write_reports(result, out / variant_name)
