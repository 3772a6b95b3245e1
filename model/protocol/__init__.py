"""The overlap-scheduler protocol model (PROTOCOL.md §1–3, §7), written only against
:class:`model.device.Device`.

Entry point: :func:`run_protocol` runs a scenario's workload through the overlap loop on a
device and returns the host-side :class:`ProtocolOutcome`; :func:`compare_runs` holds an
overlapped run against the serial oracle, value by value.

The parts, named after SGLang's: :class:`~model.protocol.context.RunContext` (streams,
scheduler buffers, sizes, costs), :class:`~model.protocol.future_map.FutureMap` (the relay:
publish / stash / resolve / gather), one :class:`~model.protocol.barrier.BarrierPlacement`
per WAR-barrier placement, :class:`~model.protocol.scheduler.Scheduler` (the event loop) and
:class:`~model.protocol.run_batch.BatchRunner` (``run_batch``). Injected bugs live apart, in
``faults.py`` (the mutation layer), which :func:`run_protocol` composes in.
"""

from __future__ import annotations

from overlap_harness.model.config import Loop, ProtocolConfig, Scenario, Timing, Workload
from overlap_harness.model.device import Device
from overlap_harness.model.protocol.barrier import placement_for
from overlap_harness.model.protocol.context import RunContext, StreamAliasError
from overlap_harness.model.protocol.faults import future_map_for
from overlap_harness.model.protocol.one_forward_thread import run_one_forward_thread
from overlap_harness.model.protocol.oracle import ValueDiff, compare_runs
from overlap_harness.model.protocol.outcome import DebugFailure, ProtocolOutcome, RequestOutcome
from overlap_harness.model.protocol.run_batch import BatchRunner
from overlap_harness.model.protocol.scheduler import Scheduler

__all__ = [
    "DebugFailure",
    "ProtocolOutcome",
    "RequestOutcome",
    "StreamAliasError",
    "ValueDiff",
    "compare_runs",
    "run_protocol",
]


def run_protocol(
    dev: Device,
    scenario: Scenario | tuple[ProtocolConfig, Workload, Timing],
) -> ProtocolOutcome:
    """Run the scenario's workload through the overlap loop on ``dev``.

    Args:
        dev: the device (simulated, serial oracle, or CUDA). Its ``removed`` labels are the
            mutation; its ``observations`` collect the values read by observed ops.
        scenario: a :class:`Scenario` or a ``(protocol, workload, timing)`` triple.

    Returns:
        The host-side outcome: per request the tokens, the seq_lens the host used, accept
        lengths; the batches; debug-check failures. The caller calls ``dev.finish()`` for the
        timeline and the races.

    Raises:
        StreamAliasError: ``protocol.alias_schedule_forward`` (S and F the same stream, #31681).
        HarnessError: a gather implementation the device cannot run, or a pool too small.
    """
    if isinstance(scenario, Scenario):
        proto, workload, timing = scenario.protocol, scenario.workload, scenario.timing
    else:
        proto, workload, timing = scenario
    if proto.loop == Loop.ONE_FORWARD_THREAD:  # TokenSpeed's design
        outcome = run_one_forward_thread(dev, proto, workload, timing)
        outcome.skipped_syncs = list(dev.skipped_syncs)
        return outcome
    ctx = RunContext(dev, proto, timing)
    runner = BatchRunner(ctx, future_map_for(ctx, workload), placement_for(proto))
    sched = Scheduler(ctx, workload, runner)
    for n in range(workload.iterations):
        sched.iteration(n)
    sched.drain(workload.iterations)
    ctx.outcome.skipped_syncs = list(dev.skipped_syncs)
    return ctx.outcome
