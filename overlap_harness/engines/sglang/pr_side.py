"""SGLang as the pull-request view's child runs it (engines/core/pr_view/child.py): the tree
imported, its variants, one variant's run with the recorder's races and watch, the necessity
table, and which variants the loaded release cannot run."""

from __future__ import annotations

from typing import Any

from overlap_harness.engines.core.pr_view.child import EngineSide


def side(source: str) -> EngineSide:
    """Import SGLang from ``source`` and hand its runs to the child."""
    from overlap_harness.engines.sglang import environment

    tree = environment.load(source)
    from overlap_harness.engines.core.necessity import necessity_table
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.release_features import not_applicable_reason
    from overlap_harness.engines.sglang.report.path_sites import path_sites, run_outcome
    from overlap_harness.engines.sglang.variants import VARIANTS

    def run(name: str) -> tuple[list[Any], Any]:
        loop = run_variant(VARIANTS[name])
        return loop.races, loop.watch

    return EngineSide(tree.version, list(VARIANTS), run,
                      lambda names, base, jobs: necessity_table(path_sites(), names, base,
                                                                run_outcome, jobs),
                      run_outcome, lambda name: not_applicable_reason(VARIANTS[name]))
