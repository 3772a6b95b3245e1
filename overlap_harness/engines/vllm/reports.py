"""``overlap-harness vllm --out``: each variant run once more (vLLM loaded) and its timeline
plot, Perfetto trace and SARIF written under ``DIR/<variant>`` by the core's writer."""

from __future__ import annotations

from pathlib import Path

#: the plotted iteration: from the third step (or engine call) on, two batches are in flight
#: and the previous one's output is being taken, in every variant
PLOTTED_ITERATION = 2


def write_variant_reports(variant_name: str, out: Path) -> list[Path]:
    """Run ``variant_name`` and write its reports under ``out/variant_name``."""
    from overlap_harness.engines.core.variant_reports import write_watch_reports
    from overlap_harness.engines.vllm.necessity import variant_runs

    watcher = variant_runs()[variant_name]()
    return write_watch_reports(f"vllm-{variant_name}", watcher, out / variant_name,
                               PLOTTED_ITERATION)
