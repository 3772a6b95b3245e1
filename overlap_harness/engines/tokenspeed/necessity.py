"""TokenSpeed's variants and the functions they drive, handed to the engine-neutral core.

The core finds the sync sites of the driven functions (:func:`~overlap_harness.engines.core.
sites.function_sites`, the AST scan of each function's file), removes each in turn in a forked
child and runs the variants without it (:func:`~overlap_harness.engines.core.necessity.
necessity_table`). What is TokenSpeed's here: which functions are driven (:func:`targets`),
the variants (:mod:`.variants`) and one variant's run as the core's :class:`VariantOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from overlap_harness.engines.core.engine_command import watch_outcome
from overlap_harness.engines.core.necessity import necessity_table
from overlap_harness.engines.core.results import NecessityRow, VariantOutcome
from overlap_harness.engines.core.sites import SyncSite, function_sites


def variant_runs() -> dict[str, Callable[[], Any]]:
    """Every TokenSpeed variant by name; each run returns the recorder's ``Watch``."""
    from overlap_harness.engines.tokenspeed.variants import variant_runs as runs

    return runs()


def targets() -> list[tuple[Any, str]]:
    """TokenSpeed's driven functions that hold (or may hold) sync statements."""
    from tokenspeed.runtime.engine.event_loop import EventLoop
    from tokenspeed.runtime.execution.device import DeviceHandle
    from tokenspeed.runtime.execution.input_buffer import InputBuffers
    from tokenspeed.runtime.execution.model_executor import ModelExecutor
    from tokenspeed.runtime.execution.runtime_states import RuntimeStates
    from tokenspeed.runtime.execution.types import ModelExecutionResult, PendingExecution
    from tokenspeed.runtime.sampling.backends.flashinfer import FlashInferSamplingBackend

    return [(EventLoop, "event_loop"), (EventLoop, "_commit_forward_results"),
            (DeviceHandle, "execute"), (DeviceHandle, "_submit_forward"),
            (PendingExecution, "result"), (ModelExecutionResult, "sync"),
            (ModelExecutor, "execute_forward_op"), (ModelExecutor, "_write_valid_cache_lengths"),
            (ModelExecutor, "_update_runtime_state"),
            (InputBuffers, "fill_input_buffers"), (InputBuffers, "_bulk_pinned"),
            (RuntimeStates, "reset_states"),
            (FlashInferSamplingBackend, "_prepare_step_hook"),
            (FlashInferSamplingBackend, "get_packed_output_d2h")]


def sites() -> list[SyncSite]:
    """Every sync site of the driven functions."""
    return [s for owner, attribute in targets() for s in function_sites(owner, attribute)]


def run_outcome(name: str) -> VariantOutcome:
    """One run of variant ``name`` as the core's outcome (a crash becomes its ``error``)."""
    return watch_outcome(name, variant_runs()[name])


def table(names: Sequence[str], baseline: dict[str, VariantOutcome],
          jobs: int = 1) -> list[NecessityRow]:
    """The necessity table of TokenSpeed's driven syncs over the variants ``names``."""
    return necessity_table(sites(), names, baseline, run_outcome, jobs)
