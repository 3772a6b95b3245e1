"""TokenSpeed's variants and the functions they drive, handed to the engine-neutral core.

The core finds the sync sites of the driven functions (:func:`~overlap_harness.engines.core.
sites.function_sites`, the AST scan of each function's file), removes each in turn in a forked
child and runs the variants without it (:func:`~overlap_harness.engines.core.necessity.
necessity_table`). What is TokenSpeed's here: which functions are driven (:func:`targets`),
the variants (:mod:`.variants`) and one variant's run as the core's :class:`VariantOutcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from overlap_harness.engines.core.engine_command import WatchedEngine


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


ENGINE = WatchedEngine(targets, variant_runs)
#: every sync site of the driven functions; one variant's outcome; the necessity table
sites, run_outcome, table = ENGINE.sites, ENGINE.run_outcome, ENGINE.table
