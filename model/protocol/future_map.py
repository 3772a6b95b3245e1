"""The FutureMap relay (PROTOCOL.md §3): a batch's results to the next iteration.

:class:`FutureMap` is named after SGLang's class and, like it, owns its buffers and its
events: ``output_tokens_buf``, ``new_seq_lens_buf``, the lazily allocated ``topk_p_buf`` /
``topk_index_buf`` / ``hidden_states_buf``, the pinned seq_lens mirror, and ``publish_ready``.
Its methods are the protocol's relay steps:

- :meth:`FutureMap.publish` scatters the new seq_lens on F and records ``publish_ready``;
- :meth:`FutureMap.stash` scatters the bonus token, top-k and hidden states on F;
- :meth:`FutureMap.resolve` gathers seq_lens on S and brings their CPU copy to the host
  (from D, or by a blocking ``.cpu()`` on S);
- :meth:`FutureMap.gather` (spec-v2) and :meth:`FutureMap.gather_output_tokens` (non-spec)
  gather the relayed values on F for the next forward.

Rows are the request-pool rows (REF); :class:`RingFutureMap` is the old ring layout (#13713).
Every sync carries its SyncLabel. Bug injections (a stash on a side stream, skipped or
replayed rows) are not here: they subclass this class in ``faults.py``, the mutation layer,
through the decision points :meth:`FutureMap.publish_positions` and
:meth:`FutureMap.stash_launches` and the no-op hooks around the stash and the gathers.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.model.config import SeqLensD2H
from overlap_harness.model.device import Buffer, Stream, SyncLabel
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.kernels import gather_spec_extras
from overlap_harness.model.protocol.outcome import DebugFailure
from overlap_harness.model.protocol.relay_v0523 import ConfidenceRelay
from overlap_harness.model.protocol.state import Batch
from overlap_harness.model.protocol.synth import clamp_index, take_rows

I64 = torch.int64


class FutureMap:
    """The relay buffers and events of one run, and the steps that use them."""

    def __init__(self, ctx: RunContext, **more: Any) -> None:
        """``more``: unused here; the keyword arguments faults composed with it take."""
        self.ctx = ctx
        device, config = ctx.device, ctx.config
        self.slots = self.slot_count()  # rows of each relay buffer
        poison = -1 if config.debug_poison else None  # -1 poison (#26108; seq_lens #30471)
        self.output_tokens_buf = device.buffer("output_tokens_buf", (self.slots,), I64,
                                               fill=poison)
        self.new_seq_lens_buf = device.buffer("new_seq_lens_buf", (self.slots,), I64,
                                              fill=poison)
        self.seq_lens_mirror: Buffer | None = (
            device.buffer("new_seq_lens_cpu_pinned", (self.slots,), I64, pinned=True)
            if ctx.d2h_stream is not None else None)
        self.topk_p_buf: Buffer | None = None  # lazy, first non-empty stash (§7 bootstrap)
        self.topk_index_buf: Buffer | None = None
        self.hidden_states_buf: Buffer | None = None
        self.publish_ready = device.event("publish_ready")
        self.publish_recorded = False
        self.verify_done = device.event("verify_done")  # legacy, before #25879
        self.verify_done_recorded = False
        # 0.5.23 (overlap_utils.py:346-350, 673): armed by a recording publish, consumed by
        # an event-waiting resolve (603-607)
        self.publish_fresh = False
        self.confidence_relay: ConfidenceRelay | None = (
            ConfidenceRelay(ctx, self.slots) if config.confidence_relay else None)

    def slot_count(self) -> int:
        """Rows of each relay buffer: one per request-pool row."""
        return self.ctx.pool_size

    # -- indices ----------------------------------------------------------------------------
    def build_indices(self, batch: Batch, op: str) -> None:
        """On S: the batch's ``future_indices``, its request-pool rows.

        Merge and filter build a fresh index tensor from the host's lists (cat / index with
        keep indices arriving by non-blocking H2D); F reads it later, so its lifetime is fenced
        by ``record_stream(F)`` and the pin ring. Publish and stash write the rows they gather.
        """
        batch.slots_in = batch.slots_out = batch.rows
        batch.fi = batch.fo = self._index_tensor(batch, "future_indices", op, batch.slots_in)

    def _index_tensor(self, batch: Batch, name: str, op: str, values: list[int]) -> Buffer:
        """A batch-local index tensor written on S from host-known ``values``."""
        ctx = self.ctx
        buf = ctx.tmp(batch, name, (batch.m,), I64, ctx.schedule_stream)
        vals = torch.tensor(values, dtype=I64)
        ctx.device.launch(ctx.schedule_stream, op, lambda: vals, writes=[buf],
                          cost_us=ctx.kernel_us)
        return buf

    def check_owners(self, batch: Batch) -> None:
        """Before a resolve: nothing to check (a row belongs to its request until freed)."""

    # -- resolve (step 4a) ---------------------------------------------------------------------
    def resolve(self, batch: Batch, stream_ordered: bool = False) -> list[int] | None:
        """``resolve_seq_lens_cpu``: S gathers seq_lens from ``new_seq_lens_buf``; the host
        gets its CPU copy.

        CUDA: S waits ``publish_ready``; the CPU copy comes from D (D waits
        ``publish_ready``, copies the WHOLE buffer into the pinned mirror, the host syncs D
        and selects rows), or from a blocking ``.cpu()`` on S, or not at all (backend opted
        out). Before the first publish the event was never recorded and resolve uses
        ``.cpu()``. HIP: the host waits on ``publish_ready`` instead of a stream wait, and uses
        ``.cpu()``. Legacy verify_done: S already waited on verify_done in scheduling.

        With ``debug_poison`` (#30471) the gathered values are asserted >= 0 on S and the rows
        are re-poisoned to -1 on S once the CPU copy is done, so a resolve without a fresh
        publish of its row reads -1 and result processing reports ``seq_lens_poison``.

        ``stream_ordered`` (0.5.23, overlap_utils.py:600-601, called from scheduler.py:4676 on
        HIP when the backend opts out of seq_lens_cpu): the gather runs on F after its
        forward-entry wait, with no event wait; the label ``resolve.stream_order`` removed
        issues it on S before the forward entry instead, unfenced from F's publish.
        """
        ctx, device = self.ctx, self.ctx.device
        schedule = ctx.schedule_stream
        if stream_ordered:
            self.publish_fresh = False
            if device.sync_enabled(SyncLabel.RESOLVE_STREAM_ORDER):
                schedule = ctx.forward_stream
        elif not ctx.legacy_verify_done and self.publish_recorded:
            self._consume_publish(batch)
            if ctx.on_cuda:
                device.wait_event(schedule, self.publish_ready,
                                  SyncLabel.PUBLISH_READY_SCHEDULE_WAIT)
            else:
                device.synchronize(self.publish_ready, SyncLabel.PUBLISH_READY_HOST_WAIT)
        batch.seq_lens = ctx.tmp(batch, "seq_lens", (batch.m,), I64, schedule)
        rows = list(batch.slots_in)
        slots = self.slots
        device.launch(schedule, "gather_seq_lens", lambda buf, fi: buf[clamp_index(fi, slots)],
                      reads=[(self.new_seq_lens_buf, rows), batch.fi], writes=[batch.seq_lens],
                      cost_us=ctx.kernel_us, observe="gather_seq_lens")
        if ctx.config.debug_poison:
            flags = ctx.tmp(batch, "seq_lens_flags", (batch.m,), I64, schedule)
            batch.flags["seq_lens_flags"] = flags
            device.launch(schedule, "assert_seq_lens", lambda s: (s < 0).to(I64),
                          reads=[batch.seq_lens], writes=[flags], cost_us=ctx.kernel_us)
        cpu = None if stream_ordered else self._seq_lens_to_host(batch, rows)
        if ctx.config.debug_poison:
            m = len(rows)
            device.launch(schedule, "repoison_seq_lens",
                          lambda fi: torch.full((m,), -1, dtype=I64, device=fi.device),
                          reads=[batch.fi], writes=[(self.new_seq_lens_buf, rows)],
                          cost_us=ctx.kernel_us)
        return cpu

    def _seq_lens_to_host(self, batch: Batch, rows: list[int]) -> list[int] | None:
        """The CPU copy of the gathered seq_lens: from D, a blocking ``.cpu()`` on S, or none."""
        ctx, device = self.ctx, self.ctx.device
        if ctx.config.seq_lens_d2h == SeqLensD2H.NONE:
            return None
        if (ctx.d2h_stream is not None and self.publish_recorded
                and ctx.config.seq_lens_d2h == SeqLensD2H.D2H_STREAM):
            assert self.seq_lens_mirror is not None
            device.wait_event(ctx.d2h_stream, self.publish_ready,
                              SyncLabel.PUBLISH_READY_D2H_WAIT)
            device.copy(ctx.d2h_stream, self.new_seq_lens_buf, self.seq_lens_mirror,
                        non_blocking=True, cost_us=ctx.d2h_us, name="d2h_seq_lens")
            device.synchronize(ctx.d2h_stream, SyncLabel.D2H_HOST_SYNC)
            vals = device.host_read(self.seq_lens_mirror, rows, name="select_seq_lens")
            return [int(v) for v in vals.tolist()]  # a list: iterating a tensor costs more
        return self._cpu_on_schedule(batch)

    def _consume_publish(self, batch: Batch) -> None:
        """The consume-once debug assert (0.5.23, overlap_utils.py:603-607): an event-waiting
        resolve needs a publish since the last one; a stale consume is a ``publish_not_fresh``
        :class:`DebugFailure` (SGLang's host ``assert``; the run goes on here)."""
        config = self.ctx.config
        if not (config.consume_once and config.debug_poison):
            return
        if not self.publish_fresh:
            self.ctx.outcome.debug_failures.append(DebugFailure(
                batch.iteration, batch.ids[0] if batch.ids else "", "publish_not_fresh",
                "resolve without a fresh forward publish"))
        self.publish_fresh = False

    def _cpu_on_schedule(self, batch: Batch) -> list[int]:
        """The blocking ``.cpu()`` of the gathered seq_lens on S (bootstrap, HIP, or by
        choice)."""
        ctx, device = self.ctx, self.ctx.device
        assert batch.seq_lens is not None
        pinned = device.buffer("seq_lens_cpu", (batch.m,), I64, pinned=True)
        device.copy(ctx.schedule_stream, batch.seq_lens, pinned, non_blocking=False,
                    cost_us=ctx.d2h_us, label=SyncLabel.SEQ_LENS_CPU_SYNC, name="seq_lens_cpu")
        return [int(v) for v in device.host_read(pinned, None, name="read_seq_lens_cpu").tolist()]

    # -- gather (step 4c) ----------------------------------------------------------------------
    def gather(self, batch: Batch) -> dict[str, Buffer | None]:
        """Spec-v2 ``resolve_forward_inputs``: ``fi.record_stream(F)``, then the spec-extras
        gather on F.

        ``fused``/``triton`` is one launch, ``unfused`` four (§4). With ``debug_poison`` the
        assert-and-invalidate launch follows (#26108).
        """
        ctx, device, forward, m = self.ctx, self.ctx.device, self.ctx.forward_stream, batch.m
        assert batch.fi is not None
        device.record_stream(batch.fi, forward, SyncLabel.FUTURE_INDICES_RECORD_STREAM)
        self.before_gather()
        self.ensure_spec_bufs(forward)
        assert self.topk_p_buf is not None and self.topk_index_buf is not None
        rows = list(batch.slots_in)
        topk, hidden_size, slots = ctx.topk, ctx.config.hidden_size, self.slots
        out: dict[str, Buffer | None] = {
            "topk_p": ctx.tmp(batch, "topk_p", (m, topk), torch.float32, forward),
            "topk_index": ctx.tmp(batch, "topk_index", (m, topk), I64, forward),
            "bonus": ctx.tmp(batch, "bonus_tokens", (m,), I64, forward),
            "hidden": (ctx.tmp(batch, "hidden_states", (m, hidden_size), torch.float32, forward)
                       if self.hidden_states_buf is not None else None),
        }
        srcs = [("topk_p", self.topk_p_buf), ("topk_index", self.topk_index_buf),
                ("bonus", self.output_tokens_buf), ("hidden", self.hidden_states_buf)]
        srcs = [(n, b) for n, b in srcs if b is not None]
        impl = ctx.config.gather.value
        if impl == "unfused":
            for name, src in srcs:
                device.launch(forward, f"gather_{name}",
                              lambda buf, fi: buf[clamp_index(fi, slots)],
                              reads=[(src, rows), batch.fi], writes=[out[name]],
                              cost_us=ctx.kernel_us, observe="gather_spec_extras")
        else:
            has_hidden = self.hidden_states_buf is not None

            def fused(fi, tp, ti, ot, *hs):
                res = gather_spec_extras(clamp_index(fi, slots), tp, ti, ot,
                                         hs[0] if hs else None, impl)
                return res if has_hidden else res[:3]

            device.launch(forward, "gather_spec_extras", fused,
                          reads=[batch.fi] + [(b, rows) for _, b in srcs],
                          writes=[out[n] for n, _ in srcs],
                          cost_us=ctx.kernel_us, observe="gather_spec_extras")
        bonus = out["bonus"]
        assert bonus is not None
        self._assert_and_invalidate(batch, bonus)
        return out

    def gather_output_tokens(self, batch: Batch, indices: Buffer | None = None) -> Buffer:
        """Non-spec ``resolve_forward_inputs``: ``output_tokens_buf[req_pool_indices]`` on F.

        A mixed batch passes its ``mix_running_indices`` as ``indices`` (their lifetime is the
        caller's keep-alive); otherwise the batch's ``future_indices``, with no
        ``record_stream``: SGLang 0.5.23's non-spec gather (overlap_utils.py 142-146) leaves
        their lifetime to the keep-alive ring (the pin ring here) alone.
        """
        ctx, device, forward = self.ctx, self.ctx.device, self.ctx.forward_stream
        if indices is None:
            assert batch.fi is not None
            indices = batch.fi
        self.before_gather()
        ids = ctx.tmp(batch, "input_ids", (batch.m,), I64, forward)
        slots = self.slots
        device.launch(forward, "gather_output_tokens",
                      lambda buf, fi: buf[clamp_index(fi, slots)],
                      reads=[(self.output_tokens_buf, list(batch.slots_in)), indices],
                      writes=[ids], cost_us=ctx.kernel_us, observe="gather_output_tokens")
        self._assert_and_invalidate(batch, ids)
        return ids

    def _assert_and_invalidate(self, batch: Batch, gathered: Buffer) -> None:
        """CI's async assert (values >= 0) and invalidate (``buf[indices] = -1``), on F.

        The assert does not crash the run: it sets a per-row flag that copy_to_cpu brings back
        and result processing turns into a ``poison_assert`` :class:`DebugFailure`.
        """
        ctx = self.ctx
        if not ctx.config.debug_poison:
            return
        m = batch.m
        flags = ctx.tmp(batch, "assert_flags", (m,), I64, ctx.forward_stream)
        batch.flags["assert_flags"] = flags  # device side; copy_to_cpu brings it back

        def assert_invalidate(v):
            return torch.full((m,), -1, dtype=I64, device=v.device), (v < 0).to(I64)

        ctx.device.launch(ctx.forward_stream, "assert_invalidate", assert_invalidate,
                          reads=[gathered],
                          writes=[(self.output_tokens_buf, list(batch.slots_in)), flags],
                          cost_us=ctx.kernel_us, observe="assert_gathered")

    # -- publish and stash (steps 4f, 4h) ---------------------------------------------------------
    def publish(self, batch: Batch, new_seq_lens: Buffer, stream: Stream | None = None) -> None:
        """``on_publish``: scatter the new seq_lens into ``new_seq_lens_buf``, record
        publish_ready.

        Returns early for an empty batch (DP idle): no scatter and no record. Non-spec
        publishes too, unread and with no event. Legacy ``verify_done``: the scatter stands for
        S's seq_lens being rebound to the forward's output, and ``verify_done`` is recorded
        after it instead.
        """
        if batch.m == 0:
            return
        ctx = self.ctx
        stream = stream or ctx.forward_stream
        keep = self.publish_positions(batch)
        rows = [batch.slots_out[i] for i in keep]
        # An adopted relay (0.5.23, overlap_utils.py:364-371, 658-663): the static verify
        # graph's replay already scattered the lengths into this very buffer, and publish
        # skips its scatter; the write is the graph's, on F, before the record below.
        op = "verify_graph_relay_scatter" if ctx.config.adopted_relay else "publish"
        ctx.device.launch(stream, op, lambda v, fo: take_rows(v, keep),
                          reads=[new_seq_lens, batch.fo], writes=[(self.new_seq_lens_buf, rows)],
                          cost_us=ctx.kernel_us)
        # DSpark publishes a confidence with a decode's lengths only (a prefill's publish has
        # none: FutureMap.publish's publish_confidence is False, no scatter, no ring copy)
        relay = self.confidence_relay if ctx.is_spec and batch.kind == "decode" else None
        if relay is not None:
            relay.scatter(batch, new_seq_lens)
        if ctx.legacy_verify_done:  # S's seq_lens are the forward's output, fenced by verify_done
            ctx.device.record(self.verify_done, stream)
            self.verify_done_recorded = True
        elif ctx.is_spec:
            ctx.device.record(self.publish_ready, stream)
            self.publish_recorded = True
            self.publish_fresh = True
            if relay is not None:
                relay.issue_ring_copy(self.publish_ready)

    def stash(self, batch: Batch, tokens: Buffer, topk_p: Buffer | None = None,
              topk_index: Buffer | None = None, hidden: Buffer | None = None) -> None:
        """Scatter the bonus tokens (and top-k, hidden states) into their relay rows, on F:
        FIFO before the next gather, so no event is needed. Empty batches return early."""
        if batch.m == 0:
            return
        stream = self.stash_stream()
        srcs: list[tuple[Buffer, Buffer | None]] = [(tokens, self.output_tokens_buf)]
        if topk_p is not None and topk_index is not None:
            self.ensure_spec_bufs(stream)
            srcs += [(topk_p, self.topk_p_buf), (topk_index, self.topk_index_buf)]
            if hidden is not None and self.hidden_states_buf is not None:
                srcs.append((hidden, self.hidden_states_buf))
        for name, positions in self.stash_launches(batch):
            self._scatter(stream, batch, name, positions, srcs)
        self.after_stash(stream, batch, [src for src, _ in srcs])

    def ensure_spec_bufs(self, stream: Stream) -> None:
        """Allocate the top-k and hidden relay buffers on first use (``torch.empty``)."""
        if self.topk_p_buf is not None:
            return
        ctx, device = self.ctx, self.ctx.device
        self.topk_p_buf = device.buffer("topk_p_buf", (self.slots, ctx.topk), torch.float32,
                                        stream=stream)
        self.topk_index_buf = device.buffer("topk_index_buf", (self.slots, ctx.topk), I64,
                                            stream=stream)
        if ctx.config.hidden_states:
            self.hidden_states_buf = device.buffer(
                "hidden_states_buf", (self.slots, ctx.config.hidden_size), torch.float32,
                stream=stream)

    def _scatter(self, stream: Stream, batch: Batch, name: str, positions: list[int],
                 srcs: list[tuple[Buffer, Buffer | None]]) -> None:
        """One stash launch: rows ``positions`` of each source into those requests' rows."""
        if not positions:
            return
        rows = [batch.slots_out[i] for i in positions]
        reads: list = [src for src, _ in srcs] + [batch.fo]
        writes: list = [(dst, rows) for _, dst in srcs]
        full = len(positions) == batch.m

        def fn(*v):
            vals = tuple(x if full else take_rows(x, positions) for x in v[:-1])
            return vals if len(vals) > 1 else vals[0]

        self.ctx.device.launch(stream, name, fn, reads=reads, writes=writes,
                               cost_us=self.ctx.kernel_us)

    # -- decision points the mutation layer (faults.py) overrides -------------------------------
    def publish_positions(self, batch: Batch) -> list[int]:
        """Which of the batch's requests publish: all of them."""
        return list(range(batch.m))

    def stash_launches(self, batch: Batch) -> list[tuple[str, list[int]]]:
        """The stash launches, as (op name, batch positions): one, of every request."""
        return [("stash", list(range(batch.m)))]

    def stash_stream(self) -> Stream:
        """The stream the stash runs on: F."""
        return self.ctx.forward_stream

    def after_stash(self, stream: Stream, batch: Batch, sources: list[Buffer]) -> None:
        """After the stash launches: nothing (F's FIFO orders them before the next gather)."""

    def before_gather(self) -> None:
        """Before a gather on F: nothing (the stash ran earlier on F)."""

    def on_forward_entry(self, batch: Batch) -> None:
        """F has entered the forward of ``batch`` (after its wait on S): nothing to relay."""

    def on_loop_end(self) -> None:
        """The loop has run its last iteration: nothing left to relay."""


class RingFutureMap(FutureMap):
    """The old FutureMap ring (before #25862): ``ring_size`` slots handed out in turn.

    A batch gathers from the slots its requests last wrote (``future_indices``) and writes
    fresh ones (``future_indices_out``); chunked prefill overflows a small ring, and a slot is
    handed to another request before its reader gathered it (#13713), which
    :meth:`check_owners` reports as a ``ring_alias`` debug failure.
    """

    def __init__(self, ctx: RunContext, **more: Any) -> None:
        """``more``: the keyword arguments of faults composed with this layout."""
        super().__init__(ctx, **more)
        self.ring_counter = 0
        self.ring_owner: dict[int, str] = {}

    def slot_count(self) -> int:
        """Rows of each relay buffer: the ring's slots."""
        return self.ctx.config.ring_size

    def build_indices(self, batch: Batch, op: str) -> None:
        """On S: the slots to gather (each request's last) and fresh slots to write."""
        out = []
        for r in batch.reqs:
            slot = self.ring_counter % self.slots
            self.ring_counter += 1
            self.ring_owner[slot] = r.id
            out.append(slot)
        batch.slots_in = [r.fslot for r in batch.reqs]
        batch.slots_out = out
        for r, slot in zip(batch.reqs, out, strict=True):
            r.fslot = slot
        batch.fi = self._index_tensor(batch, "future_indices", op, batch.slots_in)
        batch.fo = self._index_tensor(batch, "future_indices_out", op + "_out", batch.slots_out)

    def check_owners(self, batch: Batch) -> None:
        """Each gathered slot must still belong to its reader (else ``ring_alias``)."""
        for r, slot in zip(batch.reqs, batch.slots_in, strict=True):
            owner = self.ring_owner.get(slot)
            if owner != r.id:
                self.ctx.outcome.debug_failures.append(DebugFailure(
                    batch.iteration, r.id, "ring_alias",
                    f"FutureMap ring slot {slot} was reallocated to {owner!r} before {r.id!r} "
                    "read it"))
