"""``overlap-harness tokenspeed --out``: each variant run once more and its timeline plot,
Perfetto trace and SARIF written under ``DIR/<variant>`` by the core's writer."""

from __future__ import annotations

from pathlib import Path

#: the plotted round: from the third on, one forward is in flight while the previous one is
#: committed, in every overlapping variant
PLOTTED_ITERATION = 3


def write_variant_reports(variant_name: str, out: Path) -> list[Path]:
    """Run ``variant_name`` and write its reports under ``out/variant_name``."""
    from overlap_harness.engines.core.engine_command import write_reports_of
    from overlap_harness.engines.tokenspeed.necessity import variant_runs

    return write_reports_of(f"tokenspeed-{variant_name}", variant_runs()[variant_name](),
                            out / variant_name, PLOTTED_ITERATION)
