"""The mutation layer of the relay: bugs injected into the FutureMap from outside it.

The protocol modules model the code as SGLang writes it; every deliberate bug a scenario asks
for lives here, as a subclass of :class:`~model.protocol.future_map.FutureMap` that overrides
one of its decision points, so the protocol reads like the code it models:

- :class:`SideStreamStash` (``protocol.stash_stream = "side"``, §9.1): the stash moves to a
  stream of its own after it waits on F, and records ``stash_done``, which F waits on before
  its next gather (label ``stash.fifo``; a mutation that removes the label is the bug).
- :class:`RowFaults` (workload events ``skip_publish`` §9.21, ``skip_seed`` §9.18,
  ``double_stash`` §9.17): some requests' publish or stash rows are left out, or stashed a
  second time by a ``stash_replay`` launch (a replayed result, whose next stash the host then
  drops, so the row sees W W R R).
- :class:`StashAfterNextGather` (``protocol.delayed_stash_after_gather``, §9.24): the stash of
  a delayed-sampling batch is enqueued after the next gather of ``output_tokens_buf`` (or at
  the next forward entry when that batch has no such gather, or at the loop's end) instead of
  in step 7.

:func:`future_map_for` picks the classes a run needs. Removing a sync by name is the device's
part of the mutation layer (``Device(removed=...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from overlap_harness.model.config import EventKind, FutureLayout, StashStream, Workload
from overlap_harness.model.device import Buffer, Stream, SyncLabel
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.future_map import FutureMap, RingFutureMap
from overlap_harness.model.protocol.state import Batch

ROW_FAULT_KINDS = frozenset({EventKind.SKIP_PUBLISH, EventKind.SKIP_SEED, EventKind.DOUBLE_STASH})


class SideStreamStash(FutureMap):
    """The stash on a side stream, ordered before the next gather only by ``stash_done``."""

    def __init__(self, ctx: RunContext, **more: Any) -> None:
        """``more``: the keyword arguments of faults composed with this one."""
        super().__init__(ctx, **more)
        self.side_stream = ctx.device.stream("stash_side")
        self.stash_done = ctx.device.event("stash_done")
        self.stash_recorded = False

    def stash_stream(self) -> Stream:
        """The side stream, after it waits on F (the stashed data is ready)."""
        self.ctx.device.wait_stream(self.side_stream, self.ctx.forward_stream)
        return self.side_stream

    def after_stash(self, stream: Stream, batch: Batch, sources: list[Buffer]) -> None:
        """The side stream's reads are covered by ``record_stream`` (the pin ring may free
        them); then ``stash_done`` is recorded."""
        device = self.ctx.device
        for src in [*sources, batch.fo]:
            if src is not None:
                device.record_stream(src, self.side_stream)
        device.record(self.stash_done, self.side_stream)
        self.stash_recorded = True

    def before_gather(self) -> None:
        """F waits for the side stream's last stash (``stash.fifo``)."""
        if self.stash_recorded:
            self.ctx.device.wait_event(self.ctx.forward_stream, self.stash_done,
                                       SyncLabel.STASH_ORDER)


class RowFaults(FutureMap):
    """Rows left out of a publish or stash, or stashed twice, as the workload's events say.

    Decided per batch, in the order the batches are stashed (the order they were built): a
    request in a ``double_stash`` event is stashed twice, and its next stash is dropped (the
    host counted the replay as that stash); one in a ``skip_seed`` event is not stashed; one
    in a ``skip_publish`` event is not published.
    """

    def __init__(self, ctx: RunContext, workload: Workload, **more: Any) -> None:
        """``workload``: whose events name the rows; ``more``: as for the other faults."""
        super().__init__(ctx, **more)
        self.events = [e for e in workload.events if e.kind in ROW_FAULT_KINDS]
        self.replayed: set[str] = set()  # double-stashed: their next stash already happened

    def _ids(self, batch: Batch, kind: EventKind) -> set[str]:
        return {e.id for e in self.events if e.kind == kind and e.at == batch.iteration}

    def publish_positions(self, batch: Batch) -> list[int]:
        """Every request but those of a ``skip_publish`` event at this iteration."""
        skip = self._ids(batch, EventKind.SKIP_PUBLISH)
        return [i for i, r in enumerate(batch.reqs) if r.id not in skip]

    def stash_launches(self, batch: Batch) -> list[tuple[str, list[int]]]:
        """The stash without the skipped requests, then ``stash_replay`` of the doubled."""
        ids = set(batch.ids)
        double = self._ids(batch, EventKind.DOUBLE_STASH) & ids
        skip = (self._ids(batch, EventKind.SKIP_SEED) | self.replayed) & ids
        self.replayed = (self.replayed - skip) | double
        keep = [i for i, r in enumerate(batch.reqs) if r.id not in skip]
        return [("stash", keep), ("stash_replay", [i for i in keep if batch.reqs[i].id in double])]


class StashAfterNextGather(FutureMap):
    """The delayed-sampling stash moved after the next gather (§9.24's bug)."""

    def __init__(self, ctx: RunContext, **more: Any) -> None:
        """``more``: the keyword arguments of faults composed with this one."""
        super().__init__(ctx, **more)
        self.pending: Callable[[], None] | None = None

    def stash(self, batch: Batch, tokens: Buffer, topk_p: Buffer | None = None,
              topk_index: Buffer | None = None, hidden: Buffer | None = None) -> None:
        """A delayed-sampling batch's stash (its forward left logits) waits; others run."""
        if batch.logits is not None:
            self.pending = partial(super().stash, batch, tokens, topk_p, topk_index, hidden)
        else:
            super().stash(batch, tokens, topk_p, topk_index, hidden)

    def gather_output_tokens(self, batch: Batch, indices: Buffer | None = None) -> Buffer:
        """The gather, then the deferred stash."""
        ids = super().gather_output_tokens(batch, indices)
        self._flush()
        return ids

    def on_forward_entry(self, batch: Batch) -> None:
        """A batch with no output-token gather of its own: the deferred stash now."""
        if batch.kind != "decode":
            self._flush()

    def on_loop_end(self) -> None:
        """The deferred stash of the last batch."""
        self._flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self.pending()
            self.pending = None


def future_map_for(ctx: RunContext, workload: Workload) -> FutureMap:
    """The run's FutureMap: its layout (rows, or the old ring), with the faults the scenario
    injects over it."""
    faults: list[type[FutureMap]] = []
    if ctx.config.stash_stream == StashStream.SIDE:
        faults.append(SideStreamStash)
    if any(e.kind in ROW_FAULT_KINDS for e in workload.events):
        faults.append(RowFaults)
    if ctx.config.delayed_stash_after_gather:
        faults.append(StashAfterNextGather)
    layout = RingFutureMap if ctx.config.future_layout == FutureLayout.RING else FutureMap
    if not faults:
        return layout(ctx)
    # faults over the layout: one class inheriting each (their __init__s cooperate)
    bases = (*faults, layout) if layout is not FutureMap else tuple(faults)
    cls = bases[0] if len(bases) == 1 else type("FaultyFutureMap", bases, {})
    extra = {"workload": workload} if RowFaults in faults else {}
    return cls(ctx, **extra)
