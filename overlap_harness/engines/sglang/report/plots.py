"""``--out``: the timeline plot of one iteration of SGLang's real streams, the Perfetto trace
and SARIF of each variant's run, written by the core's writer (the one ``overlap-harness
check`` uses)."""

from __future__ import annotations

from pathlib import Path

#: the iteration the plot shows: the loop is in its steady state (a batch in flight, the
#: previous one being processed) from the third iteration on
PLOTTED_ITERATION = 3


def write_variant_reports(variant_name: str, out: Path) -> list[Path]:
    """Run ``variant_name`` once more (SGLang loaded) and write its reports under ``out``."""
    from overlap_harness.engines.core.variant_reports import write_watch_reports
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.variants import VARIANTS

    run = run_variant(VARIANTS[variant_name])
    return write_watch_reports(f"sglang-{variant_name}", run.watch, out / variant_name,
                               PLOTTED_ITERATION)
