"""Relay mechanisms SGLang 0.5.23 added to its FutureMap, written against the device API.

Facts from ``python/sglang/srt/managers/overlap_utils.py`` of sglang 0.5.23 (read, not
copied; line numbers of that file):

- :class:`ConfidenceRelay` (``ConfidenceRelay``, lines 203-278; ring constants 156-157):
  ``publish`` scatters the verify's confidence into ``confidence_buf`` on the forward
  stream (``scatter``, 232-235; called at 665-667) before it records ``publish_ready``
  (670-673); then the private D2H stream waits ``publish_ready`` and copies the whole
  buffer into slot ``ring_pos % 3`` of a pinned ring, recording that slot's ``copy_done``
  (``issue_ring_copy``, 237-246). The DSpark planner (``resolve_confidence_cpu``, 465-474,
  called from ``dspark_planner.py:258``) reads slot ``ring_pos - 2`` only if one
  ``copy_done.query()`` says done (271), so a late copy is skipped, never waited for.
- :func:`resolve_mixed_spec_tails` (543-585): a spec mixed batch late-binds its decode tails
  on the forward stream: ``publish_ready.wait()`` there (HIP: ``publish_ready.synchronize()``
  on the host, 552-553), the fresh lengths ``new_seq_lens_buf[idx]`` and the tail slots
  ``req_to_token[idx, fresh]`` on F, then the CPU copy: the D2H stream waits ``publish_ready``,
  copies the whole buffer into the pinned mirror, the host synchronizes it (570-576); off
  CUDA a blocking ``.cpu()``.

Every sync carries its own :class:`SyncLabel`, so a scenario can remove it alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from overlap_harness.model.device import Buffer, Event, SyncLabel
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.state import Batch
from overlap_harness.model.protocol.synth import clamp_index

if TYPE_CHECKING:  # the FutureMap owns this module's objects; typing only, no import cycle
    from overlap_harness.model.protocol.future_map import FutureMap

I64 = torch.int64
F32 = torch.float32
RING_LAG = 2  # CONFIDENCE_RELAY_RING_LAG (overlap_utils.py:156)
RING_DEPTH = RING_LAG + 1  # CONFIDENCE_RELAY_RING_DEPTH (overlap_utils.py:157)


class ConfidenceRelay:
    """The DSpark confidence relay: a device buffer, a pinned ring of its copies, and one
    ``copy_done`` event per ring slot; see the module docstring."""

    def __init__(self, ctx: RunContext, slots: int) -> None:
        """``slots``: rows of the relay (the request pool). Buffers are made on first use."""
        self.ctx = ctx
        self.slots = slots
        self.width = ctx.config.num_steps  # gamma: one confidence per draft step
        self.confidence_buf: Buffer | None = None
        self.ring: list[Buffer] = []
        self.copy_done: list[Event] = []
        self.ring_pos = 0
        self.reads: dict[int, list[float]] = {}  # iteration -> the planner's row means

    def _lazy_init(self) -> None:
        """``_lazy_init`` (overlap_utils.py:214-230): the buffer, the pinned ring, the events."""
        device = self.ctx.device
        self.confidence_buf = device.buffer("confidence_buf", (self.slots, self.width), F32,
                                            stream=self.ctx.forward_stream)
        self.ring = [device.buffer(f"conf_ring_{slot}", (self.slots, self.width), F32,
                                   pinned=True) for slot in range(RING_DEPTH)]
        self.copy_done = [device.event(f"conf_copy_done_{slot}") for slot in range(RING_DEPTH)]

    def scatter(self, batch: Batch, new_seq_lens: Buffer) -> None:
        """On F, before ``publish_ready`` is recorded: the verify's confidence (here a function
        of the new lengths) into the batch's rows of ``confidence_buf``."""
        ctx = self.ctx
        if self.confidence_buf is None:
            self._lazy_init()
        assert self.confidence_buf is not None
        width = self.width
        rows = list(batch.slots_out)

        def confidence(lens: torch.Tensor, fo: torch.Tensor) -> torch.Tensor:
            steps = torch.arange(1, width + 1, dtype=F32, device=lens.device)
            return 1.0 / (1.0 + lens.to(F32).unsqueeze(1) * steps)

        ctx.device.launch(ctx.forward_stream, "publish_confidence", confidence,
                          reads=[new_seq_lens, batch.fo],
                          writes=[(self.confidence_buf, rows)], cost_us=ctx.kernel_us)

    def issue_ring_copy(self, publish_ready: Event) -> None:
        """D waits ``publish_ready``, copies the whole buffer into the next ring slot and
        records its ``copy_done`` (overlap_utils.py:237-246)."""
        ctx, device, d2h = self.ctx, self.ctx.device, self.ctx.d2h_stream
        if self.confidence_buf is None or d2h is None:
            return
        slot = self.ring_pos % RING_DEPTH
        device.wait_event(d2h, publish_ready, SyncLabel.CONFIDENCE_D2H_WAIT)
        device.copy(d2h, self.confidence_buf, self.ring[slot], non_blocking=True,
                    cost_us=ctx.d2h_us, name="d2h_confidence_ring")
        device.record(self.copy_done[slot], d2h)
        self.ring_pos += 1

    def resolve(self, batch: Batch) -> list[float] | None:
        """The planner's read (overlap_utils.py:248-278): slot ``ring_pos - 2`` if its
        ``copy_done`` answers one ``query()`` with done; None (no budget hint) otherwise."""
        if self.confidence_buf is None or self.ring_pos < RING_LAG or batch.m == 0:
            return None
        slot = (self.ring_pos - RING_LAG) % RING_DEPTH
        device = self.ctx.device
        if not device.query(self.copy_done[slot], SyncLabel.CONFIDENCE_COPY_DONE_QUERY):
            return None
        values = device.host_read(self.ring[slot], list(batch.rows), name="read_confidence_ring")
        means = [float(v) for v in values.mean(dim=1)]
        self.reads[batch.iteration] = means
        return means


def resolve_mixed_spec_tails(future_map: FutureMap, batch: Batch,
                             mixed: Batch | None = None) -> list[int] | None:
    """Late-bind a spec batch's decode tails from the published lengths (overlap_utils.py
    :543-585); returns the fresh lengths the host got, or None before the first publish.

    The tails' fresh lengths and their ``req_to_token`` slots are gathered on F behind the
    publish fence; the host's copy comes from D (CUDA) or a blocking ``.cpu()`` on F. With
    ``mixed`` (the spec mixed batch whose decode part ``batch`` is), F also writes the mixed
    batch's new ``seq_lens``: the prefill part's, then each tail's fresh length + 1 (557-559).
    """
    ctx, device, forward = future_map.ctx, future_map.ctx.device, future_map.ctx.forward_stream
    if batch.m == 0 or not future_map.publish_recorded:
        return None  # no publish yet: the bootstrap path, nothing relayed to late-bind
    if ctx.on_cuda:
        device.wait_event(forward, future_map.publish_ready,
                          SyncLabel.MIXED_TAILS_FORWARD_WAIT)
    else:  # "Event.wait() regresses TPOT on AMD MI355" (overlap_utils.py:552-553, 608-610)
        device.synchronize(future_map.publish_ready, SyncLabel.MIXED_TAILS_HOST_WAIT)
    rows, slots = list(batch.slots_in), future_map.slots
    fresh = ctx.tmp(batch, "mixed_tail_lens", (batch.m,), I64, forward)
    device.launch(forward, "mixed_tail_lens", lambda buf, fi: buf[clamp_index(fi, slots)],
                  reads=[(future_map.new_seq_lens_buf, rows), batch.fi], writes=[fresh],
                  cost_us=ctx.kernel_us, observe="mixed_tail_lens")
    if mixed is not None:
        head = mixed.parts[0].seq_lens
        assert head is not None
        # held by the running batch until its next filter, not by the pin ring
        mixed.seq_lens = device.buffer("seq_lens", (mixed.m,), I64, stream=forward)
        device.launch(forward, "mixed_seq_lens", lambda h, f: torch.cat([h, f + 1]),
                      reads=[head, fresh], writes=[mixed.seq_lens], cost_us=ctx.kernel_us)
    columns = [min(max(n, 0), ctx.max_context - 1) for n in (batch.host_lens or
                                                    [r.kv_committed for r in batch.reqs])]
    cells = (rows, columns)
    tail_loc = ctx.tmp(batch, "mixed_tail_out_cache_loc", (batch.m,), I64, forward)
    width = ctx.max_context

    def tail_slots(table: torch.Tensor, lens: torch.Tensor, fi: torch.Tensor) -> torch.Tensor:
        col = lens.clamp(0, width - 1)
        return table[clamp_index(fi, table.shape[0]), col]

    device.launch(forward, "mixed_tail_out_cache_loc", tail_slots,
                  reads=[(ctx.req_to_token, cells), fresh, batch.fi], writes=[tail_loc],
                  cost_us=ctx.kernel_us)
    d2h, mirror = ctx.d2h_stream, future_map.seq_lens_mirror
    if d2h is not None and mirror is not None:
        device.wait_event(d2h, future_map.publish_ready, SyncLabel.MIXED_TAILS_D2H_WAIT)
        device.copy(d2h, future_map.new_seq_lens_buf, mirror, non_blocking=True,
                    cost_us=ctx.d2h_us, name="d2h_mixed_tail_lens")
        device.synchronize(d2h, SyncLabel.D2H_HOST_SYNC)
        values = device.host_read(mirror, rows, name="select_mixed_tail_lens")
    else:  # bootstrap / non-CUDA: fresh.cpu() on the current stream, F
        pinned = device.buffer("mixed_tail_lens_cpu", (batch.m,), I64, pinned=True)
        device.copy(forward, fresh, pinned, non_blocking=False, cost_us=ctx.d2h_us,
                    name="mixed_tail_lens_cpu")
        values = device.host_read(pinned, None, name="read_mixed_tail_lens")
    return [int(v) for v in values.tolist()]  # a list: iterating a tensor costs more
