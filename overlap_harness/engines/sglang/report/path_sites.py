"""The SGLang modules on the overlap loop's path, their sync sites, and one variant's run as
the engine-neutral core wants it."""

from __future__ import annotations

import os
import sys

from overlap_harness.engines.core.helper_sites import scan_files
from overlap_harness.engines.core.necessity import MUTABLE_KINDS, format_error
from overlap_harness.engines.core.results import VariantOutcome, race_record
from overlap_harness.engines.core.sites import SyncSite

#: modules scanned for sync sites: the loop, its relay, result processing, the D2H helper,
#: the result copy, the EAGLE v2 workers (single- and multi-layer) and their record_stream
#: helpers, the CUDA-graph runners and their read-done event
PATH_MODULES = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.managers.scheduler_components.batch_result_processor",
    "sglang.srt.managers.utils",
    "sglang.srt.utils.common",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.multi_layer_eagle_worker_v2",
    "sglang.srt.speculative.eagle_worker_common",
    "sglang.srt.speculative.spec_utils",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.model_executor.runner.base_cuda_graph_runner",
    "sglang.srt.model_executor.runner_utils.shared_read_event",
)


def path_files() -> list[str]:
    """The files of :data:`PATH_MODULES` as imported (SGLang must be loaded): absolute, links
    kept, as the modules' code names them (a tree of links to another tree's files, as a
    mirror for a pull request's view is, is edited and named as itself, not as the files
    its links point to)."""
    import importlib

    files = []
    for name in PATH_MODULES:
        module = sys.modules.get(name) or importlib.import_module(name)
        files.append(os.path.abspath(module.__file__))
    return files


def path_sites() -> list[SyncSite]:
    """Every sync site of the path's files, and every call of a sync helper defined there
    (:mod:`~overlap_harness.engines.core.helper_sites`), in file then line order."""
    return scan_files(path_files(), MUTABLE_KINDS)


def run_outcome(variant_name: str) -> VariantOutcome:
    """One variant on the real loop, as plain data; a crash is kept, not raised."""
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.variants import VARIANTS

    try:
        run = run_variant(VARIANTS[variant_name])
    except Exception as exc:
        return VariantOutcome(variant_name, error=format_error(exc))
    return VariantOutcome(variant_name, [race_record(r, variant_name) for r in run.races],
                          run.iterations, run.seconds, unknown_ops=run.unknown_ops)
