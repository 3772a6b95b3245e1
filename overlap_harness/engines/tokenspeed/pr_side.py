"""TokenSpeed as the pull-request view's child runs it (engines/core/pr_view/child.py)."""

from __future__ import annotations

from typing import Any


def side(source: str) -> Any:
    """Import TokenSpeed from ``source`` and hand its runs to the child."""
    from overlap_harness.engines.core.engine_command import watch_side
    from overlap_harness.engines.tokenspeed import environment

    info = environment.load(source)
    from overlap_harness.engines.tokenspeed import necessity

    return watch_side(info.version, necessity.variant_runs(), necessity.table,
                      necessity.run_outcome)
