"""vLLM's variants and the functions they drive, handed to the engine-neutral core.

The core finds the sync sites (:func:`~overlap_harness.engines.core.sites.function_sites`, the
AST scan of each driven function's file), removes each in turn in a forked child and runs the
variants without it (:func:`~overlap_harness.engines.core.necessity.necessity_table`). What is
vLLM's here: which functions are driven (:func:`targets`), which variants exist
(:func:`variant_runs`), and one variant run as the core's :class:`VariantOutcome`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from overlap_harness.engines.core.necessity import MUTABLE_KINDS, format_error, necessity_table
from overlap_harness.engines.core.results import NecessityRow, VariantOutcome, race_record
from overlap_harness.engines.core.sites import SyncSite, function_sites


def variant_runs() -> dict[str, Callable[[], Any]]:
    """Every vLLM variant by name; each run returns the recorder's ``Watch``."""
    from overlap_harness.engines.vllm import (
        chunked_prefill,
        drivers,
        encoder_only,
        engine_core,
        hybrid_spec_decode,
        mrv2_spec_decode,
        pipeline,
    )

    runs: dict[str, Callable[[], Any]] = {name: variant.run
                                          for name, variant in drivers.VARIANTS.items()}
    runs["engine-core"] = engine_core.engine_steps
    runs["chunked-prefill"] = chunked_prefill.chunked_prefill_steps
    runs["mrv2-spec-decode"] = mrv2_spec_decode.mrv2_spec_decode
    runs["pp-batch-queue"] = pipeline.pp_batch_queue_steps
    runs["v1-hybrid-spec-decode"] = hybrid_spec_decode.hybrid_spec_decode_steps
    runs["v1-hybrid-spec-decode-sync"] = hybrid_spec_decode.without_async_scheduling
    runs["v1-hybrid-spec-decode-async-none"] = hybrid_spec_decode.async_without_align
    runs["mrv2-encoder-only"] = encoder_only.encoder_only_steps
    return runs


#: vLLM's driven functions that hold sync statements, ``module:Class.function``
TARGETS = (
    "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput.__init__",
    "vllm.v1.worker.gpu_model_runner:AsyncGPUModelRunnerOutput.get_output",
    *(f"vllm.v1.worker.gpu_model_runner:GPUModelRunner.{name}" for name in (
        "synchronize_input_prep", "_copy_valid_sampled_token_count",
        "_get_valid_sampled_token_count", "_copy_draft_token_ids_to_cpu",
        "_get_draft_token_ids_cpu", "_prepare_inputs", "_update_states_after_model_execute",
        "_build_attention_metadata")),
    "vllm.v1.worker.gpu_model_runner:AsyncGPUPoolingModelRunnerOutput.__init__",
    "vllm.v1.worker.gpu_model_runner:AsyncGPUPoolingModelRunnerOutput.get_output",
    "vllm.v1.worker.gpu.async_utils:AsyncOutput.__init__",
    "vllm.v1.worker.gpu.async_utils:AsyncOutput.get_output",
    "vllm.v1.worker.gpu.async_utils:AsyncPoolingOutput.__init__",
    "vllm.v1.worker.gpu.async_utils:AsyncPoolingOutput.get_output",
    "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.set_draft_tokens",
    "vllm.v1.worker.gpu.spec_decode.utils:DraftTokensHandler.get_draft_tokens",
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification:"
    "AdaptiveVerificationManager.record_confidences",
    "vllm.v1.worker.gpu.pp_utils:PPHandler.get_prev_sampled_outputs",
    "vllm.v1.worker.gpu.pp_utils:PPHandler.receive",
    "vllm.v1.worker.gpu.pp_utils:PPHandler.broadcast",
    "vllm.v1.worker.mm_encoder_model_runner:MMEncoderModelRunner.input_tensor_semaphore",
)


def targets() -> list[tuple[Any, str]]:
    """The driven functions of :data:`TARGETS` the loaded tree has, as ``(owner, name)``
    (a release without the V1 runner, or without Model Runner V2, has fewer)."""
    import importlib

    from overlap_harness.engines.vllm.release_features import missing

    found = []
    for target in TARGETS:
        if missing(target) is not None:
            continue
        module_name, _, dotted = target.partition(":")
        owner_name, attribute = dotted.rsplit(".", 1)
        owner: Any = importlib.import_module(module_name)
        for part in owner_name.split("."):
            owner = getattr(owner, part)
        found.append((owner, attribute))
    return found


def sites() -> list[SyncSite]:
    """Every sync site of the driven functions (non-blocking copies included, as listed)."""
    return [s for owner, attribute in targets() for s in function_sites(owner, attribute)]


def run_outcome(name: str) -> VariantOutcome:
    """One run of variant ``name`` as the core's outcome (a crash becomes its ``error``)."""
    started = time.process_time()
    try:
        watcher = variant_runs()[name]()
    except Exception as exc:  # the tree cannot be driven: the caller reports the line
        return VariantOutcome(name, error=format_error(exc),
                              seconds=time.process_time() - started)
    return VariantOutcome(name, [race_record(r, name) for r in watcher.races],
                          ops=watcher.recording.ops_recorded,
                          seconds=time.process_time() - started,
                          unknown_ops=[u.name for u in watcher.unknown_ops])


def table(names: Sequence[str], baseline: dict[str, VariantOutcome],
          jobs: int = 1) -> list[NecessityRow]:
    """The necessity table of vLLM's driven syncs over the variants ``names``."""
    return necessity_table(sites(), names, baseline, run_outcome, jobs)


__all__ = ["MUTABLE_KINDS", "TARGETS", "run_outcome", "sites", "table", "targets", "variant_runs"]
