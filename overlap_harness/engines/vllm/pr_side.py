"""vLLM as the pull-request view's child runs it (engines/core/pr_view/child.py): the tree
imported, its variants, one variant's run with the recorder's races and watch, and the
necessity table, and which variants the tree lacks the code of."""

from __future__ import annotations

from typing import Any

from overlap_harness.engines.core.pr_view.child import EngineSide


def side(source: str) -> EngineSide:
    """Import vLLM from ``source`` and hand its runs to the child."""
    from overlap_harness.engines.vllm import environment

    info = environment.load(source)
    from overlap_harness.engines.vllm import necessity
    from overlap_harness.engines.vllm.release_features import not_applicable_reason

    runs = necessity.variant_runs()

    def run(name: str) -> tuple[list[Any], Any]:
        watcher = runs[name]()
        return watcher.races, watcher

    return EngineSide(info.version, list(runs), run, necessity.table, necessity.run_outcome,
                      not_applicable_reason)
