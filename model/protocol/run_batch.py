"""Step 4, ``run_batch`` (PROTOCOL.md §1): resolve, the forward-entry fence, the gathers, the
forward on F, publish, stash, copy_to_cpu and the pin ring; and step 7, delayed sampling.

:class:`BatchRunner` holds the run's :class:`RunContext`, its :class:`FutureMap` and its WAR
barrier placement, and calls the placement at the points of the forward where a barrier may
be recorded (after the metadata reads, after the forward's last reads of S-written buffers).

A mixed batch (non-spec, §7 and §9.16) is a prefill chunk plus the running decodes: S builds
``mix_running_indices`` while scheduling, F gathers ``output_tokens_buf[mix_running_indices]``
for the decode part, and the index tensor is kept alive until that gather by the
``mix_running_indices.keep_alive`` label (``record_stream(F)`` plus the pin ring, as SGLang's
``extra_keep_alive_refs``). Removed, the host drops it when run_batch returns and the
allocator may hand its block to the next S allocation while F's gather is still pending. The
``record_stream`` alone carries ``mix_running_indices.record_stream`` (SGLang 0.5.23's own call,
overlap_utils.py 121-128); removed, the pin ring still holds the tensor.
"""

from __future__ import annotations

import torch

from overlap_harness.model.config import PublishPoint
from overlap_harness.model.device import Buffer, SyncLabel
from overlap_harness.model.protocol import worker
from overlap_harness.model.protocol.barrier import BarrierPlacement
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.future_map import FutureMap
from overlap_harness.model.protocol.outcome import DebugFailure
from overlap_harness.model.protocol.relay_v0523 import resolve_mixed_spec_tails
from overlap_harness.model.protocol.state import Batch

I64 = torch.int64


class BatchRunner:
    """``run_batch`` and delayed sampling for one run; see the module docstring."""

    def __init__(self, ctx: RunContext, future_map: FutureMap, barrier: BarrierPlacement) -> None:
        self.ctx = ctx
        self.future_map = future_map
        self.barrier = barrier

    def run(self, batch: Batch) -> None:
        """Step 4: resolve, fence, gather, forward, publish, stash, copy_to_cpu, pin."""
        ctx, device = self.ctx, self.ctx.device
        ctx.outcome.batches[batch.iteration] = batch.ids
        ctx.outcome.batch_kinds[batch.iteration] = batch.kind
        spec_decode = batch.kind == "decode" and batch.m and ctx.is_spec
        # stream-ordered (0.5.23, scheduler.py:4661-4676): after the forward entry, on F; its
        # label removed, on S before it (stream_ordered=True outside forward_stream_ctx)
        ordered = ctx.config.stream_ordered_resolve
        on_forward = ordered and device.sync_enabled(SyncLabel.RESOLVE_STREAM_ORDER)
        if spec_decode and not on_forward:
            self._resolve(batch, stream_ordered=ordered)
        device.wait_stream(ctx.forward_stream, ctx.schedule_stream, SyncLabel.FORWARD_ENTRY)
        if spec_decode and on_forward:
            self._resolve(batch, stream_ordered=True)
        self.future_map.on_forward_entry(batch)
        plan = self._plan(batch) if ctx.config.plan_stream and batch.m else None
        if batch.kind == "idle" or batch.m == 0:
            device.launch(ctx.forward_stream, "idle_forward", lambda: None,
                          cost_us=ctx.kernel_us)
            batch.copy_done = device.event("copy_done")
            device.record(batch.copy_done, ctx.forward_stream)
        elif batch.kind == "prefill":
            self._run_prefill(batch)
        elif batch.kind == "mixed":
            self._run_mixed(batch)
        elif ctx.is_spec:
            self._run_spec_decode(batch, plan)
        else:
            self._run_decode(batch)
        ctx.pin(batch)
        mix = batch.mix_idx
        if mix is not None and not mix.freed and mix not in batch.pinned:
            device.free(mix)  # keep-alive removed: the last host reference goes now

    def _resolve(self, batch: Batch, stream_ordered: bool = False) -> None:
        """Step 4a plus the host's use of it: the lengths it declares accesses with."""
        ctx = self.ctx
        self.future_map.check_owners(batch)
        cpu = self.future_map.resolve(batch, stream_ordered)
        batch.seq_lens_cpu = cpu
        if cpu is not None:
            batch.host_lens, batch.exact_lens = cpu, True
        else:
            batch.host_lens, batch.exact_lens = [r.kv_committed for r in batch.reqs], False
        for i, r in enumerate(batch.reqs):
            used = None if cpu is None else cpu[i]
            ctx.outcome.request(r.id).seq_lens_cpu[batch.iteration] = used
            if cpu is not None and cpu[i] + ctx.alloc_len > r.alloc:
                ctx.outcome.debug_failures.append(DebugFailure(
                    batch.iteration, r.id, "alloc_overrun",
                    f"seq_len {cpu[i]} + {ctx.alloc_len} > allocated {r.alloc} columns"))

    def _plan(self, batch: Batch) -> Buffer:
        """Plan stream: metadata for verify from seq_lens; F waits on PL afterwards."""
        ctx, device, plan_stream = self.ctx, self.ctx.device, self.ctx.plan_stream
        assert plan_stream is not None and batch.seq_lens is not None
        device.wait_stream(plan_stream, ctx.schedule_stream, SyncLabel.PLAN_SCHEDULE_WAIT)
        meta = ctx.tmp(batch, "plan_metadata", (batch.m,), I64, plan_stream)
        device.launch(plan_stream, "plan_metadata", lambda s: s + ctx.num_draft_tokens,
                      reads=[batch.seq_lens], writes=[meta], cost_us=ctx.kernel_us)
        device.wait_stream(ctx.forward_stream, plan_stream, SyncLabel.PLAN_WAIT)
        return meta

    def _run_prefill(self, batch: Batch, ids: Buffer | None = None) -> None:
        """Prefill (or one chunk): ids by H2D on F (unless given: a spec mixed batch's
        tails), forward, publish (spec), stash, copy."""
        ctx, fmap = self.ctx, self.future_map
        if ids is None:
            staged = batch.results.pop("staged_ids")
            ids = ctx.tmp(batch, "prefill_input_ids", staged.shape, I64, ctx.forward_stream)
            ctx.device.copy(ctx.forward_stream, staged, ids, non_blocking=True,
                            cost_us=ctx.d2h_us, name="h2d_input_ids")
        res = worker.prefill_forward(ctx, batch, ids)
        if ctx.is_spec:
            fmap.publish(batch, res["new_seq_lens"])
            res = worker.draft_prefill(ctx, batch, res)
            fmap.stash(batch, res["next_tokens"], res["next_topk_p"], res["next_topk_index"],
                       res.get("next_hidden"))
        else:
            fmap.stash(batch, res["next_tokens"])
        self._copy_to_cpu(batch, {"next_tokens": res["next_tokens"]})

    def _run_spec_decode(self, batch: Batch, plan: Buffer | None) -> None:
        """Spec-v2 decode: gather, draft, verify, publish, draft-extend, stash, copy."""
        ctx, fmap = self.ctx, self.future_map
        device, forward = ctx.device, ctx.forward_stream
        if ctx.config.mixed_spec_tails:  # inside resolve_forward_inputs, before the gathers
            resolve_mixed_spec_tails(fmap, batch)
        inputs = fmap.gather(batch)
        if fmap.confidence_relay is not None:  # the DSpark planner's budget read, on the host
            fmap.confidence_relay.resolve(batch)
        joins = ctx.config.plan_stream_joins
        # a tree's verify locations come from the plan stream, a chain's from the draft
        tree_on_plan = joins and ctx.topk > 1
        drafts, verify_cache_loc = worker.spec_draft(ctx, batch, inputs,
                                                     verify_loc=not tree_on_plan)
        self.barrier.after_metadata_reads(device, forward)
        self._record_verify_inputs(batch, drafts, verify_cache_loc,
                                   SyncLabel.VERIFY_PRE_PREPARE_RECORD_STREAM)
        if joins:
            verify_cache_loc = self._prepare_verify_on_plan(batch, verify_cache_loc)
            if ctx.config.verify_graph_load:
                drafts, verify_cache_loc = self._load_verify_graph(batch, drafts,
                                                                   verify_cache_loc)
        self._record_verify_inputs(batch, drafts, verify_cache_loc,
                                   SyncLabel.VERIFY_INPUTS_RECORD_STREAM)
        res = worker.spec_verify(ctx, batch, inputs["bonus"], drafts, verify_cache_loc, plan)
        after_verify = ctx.config.publish_point == PublishPoint.AFTER_VERIFY
        if after_verify:
            fmap.publish(batch, res["new_seq_lens"])
        self.barrier.after_forward_reads(device, forward)
        self.barrier.before_draft_extend(device, forward)
        lengths = self._prepare_draft_extend_on_plan(batch) if joins else None
        res = worker.draft_extend(ctx, batch, res, lengths)
        if not after_verify:
            fmap.publish(batch, res["new_seq_lens"])
        fmap.stash(batch, res["next_tokens"], res["next_topk_p"], res["next_topk_index"],
                   res.get("next_hidden"))
        keys = ("next_tokens", "accept_lens", "out_tokens")
        self._copy_to_cpu(batch, {k: res[k] for k in keys})

    def _record_verify_inputs(self, batch: Batch, drafts: Buffer,
                              verify_cache_loc: Buffer | None, label: SyncLabel) -> None:
        """With ``verify_record_stream``: the verify's inputs marked used on F (SGLang 0.5.23:
        before the preparation also the lengths, after it the tokens and slots the verify
        reads), so a buffer allocated on another stream is not reused while F may read it."""
        ctx = self.ctx
        if not ctx.config.verify_record_stream:
            return
        buffers = [drafts, verify_cache_loc]
        if label == SyncLabel.VERIFY_PRE_PREPARE_RECORD_STREAM:
            buffers.append(batch.seq_lens)
        for buf in buffers:
            if buf is not None and not buf.freed:
                ctx.device.record_stream(buf, ctx.forward_stream, label)

    def _prepare_verify_on_plan(self, batch: Batch, verify_cache_loc: Buffer | None) -> Buffer:
        """SGLang 0.5.23's verify preparation on the plan stream (eagle_worker_common.py
        586-601): PL waits on F (the draft's frontier), builds a tree's ``out_cache_loc``
        from ``req_to_token`` (topk > 1; a chain's came from the draft on F), then F waits
        on PL before the verify forward."""
        ctx, device = self.ctx, self.ctx.device
        plan_stream, forward = ctx.plan_stream, ctx.forward_stream
        assert plan_stream is not None
        device.wait_stream(plan_stream, forward, SyncLabel.PLAN_VERIFY_FORWARD_WAIT)
        if verify_cache_loc is None:
            verify_cache_loc = worker.verify_out_cache_loc(ctx, batch, plan_stream)
        if not ctx.config.verify_graph_load:
            device.wait_stream(forward, plan_stream, SyncLabel.PLAN_VERIFY_JOIN)
        return verify_cache_loc

    def _load_verify_graph(self, batch: Batch, drafts: Buffer, verify_cache_loc: Buffer
                           ) -> tuple[Buffer, Buffer]:
        """The verify graph's ``load_batch`` inside the verify preparation (still on the
        plan stream, before F's wait on it): the draft tokens and the verify slots copied into
        the graph's static input buffers, which the replayed verify reads."""
        ctx, device = self.ctx, self.ctx.device
        plan_stream, forward = ctx.plan_stream, ctx.forward_stream
        assert plan_stream is not None
        static_drafts = ctx.tmp(batch, "graph_static_drafts", drafts.shape, drafts.dtype,
                                plan_stream)
        static_loc = ctx.tmp(batch, "graph_static_out_cache_loc", verify_cache_loc.shape,
                             verify_cache_loc.dtype, plan_stream)
        device.launch(plan_stream, "verify_graph_load_batch", lambda d, loc: (d, loc),
                      reads=[drafts, verify_cache_loc], writes=[static_drafts, static_loc],
                      cost_us=ctx.kernel_us)
        device.wait_stream(forward, plan_stream, SyncLabel.PLAN_VERIFY_JOIN)
        return static_drafts, static_loc

    def _prepare_draft_extend_on_plan(self, batch: Batch) -> Buffer:
        """SGLang 0.5.23's draft-extend preparation on the draft worker's plan stream (its own,
        not the verify's; eagle_worker_v2.py 1160-1178): it waits on F, computes the extend
        lengths and positions from the batch's ``seq_lens`` (prepare_draft_extend_layout,
        eagle_worker_common.py 171-214), then F waits on it before the draft extend reads
        them."""
        ctx, device = self.ctx, self.ctx.device
        plan_stream, forward = ctx.draft_plan_stream, ctx.forward_stream
        assert plan_stream is not None and batch.seq_lens is not None
        device.wait_stream(plan_stream, forward, SyncLabel.PLAN_EXTEND_FORWARD_WAIT)
        lengths = ctx.tmp(batch, "draft_extend_lens", (batch.m,), I64, plan_stream)
        width = ctx.num_draft_tokens
        device.launch(plan_stream, "draft_extend_lengths", lambda s: s + width,
                      reads=[batch.seq_lens], writes=[lengths], cost_us=ctx.kernel_us)
        device.wait_stream(forward, plan_stream, SyncLabel.PLAN_EXTEND_JOIN)
        return lengths

    def _run_mixed(self, batch: Batch) -> None:
        """A prefill chunk plus the running decodes (non-spec): the decode part's ids come from
        ``output_tokens_buf[mix_running_indices]`` on F, the prefill part's by H2D."""
        ctx = self.ctx
        pre, dec = batch.parts
        mix = batch.mix_idx
        assert mix is not None
        if ctx.device.sync_enabled(SyncLabel.MIX_INDICES_KEEP_ALIVE):
            ctx.device.record_stream(mix, ctx.forward_stream,
                                     SyncLabel.MIX_INDICES_RECORD_STREAM)
            batch.pinned.append(mix)
        if ctx.is_spec:
            self._run_spec_mixed(batch, mix)
            return
        ids = self.future_map.gather_output_tokens(dec, mix)
        self._run_prefill(pre)
        self._run_decode(dec, ids, delayed=False, read_done=False)
        batch.pinned += pre.pinned + dec.pinned
        batch.copy_done = dec.copy_done

    def _run_spec_mixed(self, batch: Batch, mix: Buffer) -> None:
        """A spec mixed batch (``spec_mixed_batches``): the tails late-bound from the published
        lengths (the host learns them exactly), their input ids gathered through
        ``mix_running_indices``; then each tail runs as a one-token extend at its fresh
        length beside the prefill chunk: forward, publish, draft extend, stash, copy."""
        pre, tail = batch.parts
        tail.fi = tail.fo = mix  # the mixed-in running batch's req_pool_indices
        fresh = resolve_mixed_spec_tails(self.future_map, tail, batch)
        lens = fresh if fresh is not None else [r.kv_committed for r in tail.reqs]
        lens = [min(max(n, 0), self.ctx.max_context - 2) for n in lens]  # a stale read's value
        tail.chunk_starts = list(lens)
        tail.chunk_ends = [n + 1 for n in lens]
        tail.last_chunk = [True] * tail.m
        tail.host_lens, tail.exact_lens = tail.chunk_ends, True
        ids = self.future_map.gather_output_tokens(tail, mix)
        self._run_prefill(pre)
        self._run_prefill(tail, ids)
        batch.pinned += pre.pinned + tail.pinned
        batch.copy_done = tail.copy_done

    def _run_decode(self, batch: Batch, ids: Buffer | None = None,
                    delayed: bool | None = None, read_done: bool = True) -> None:
        """Non-spec decode: gather the input ids (unless given), forward, publish, stash,
        copy; with delayed sampling the forward leaves logits and step 7 samples them.
        ``read_done``: the runner may publish its read-done event after the forward's reads
        (a decode batch); the decode part of a mixed (extend) batch publishes none."""
        ctx, fmap = self.ctx, self.future_map
        if ids is None:
            ids = fmap.gather_output_tokens(batch)
        delayed = ctx.config.delayed_sampling if delayed is None else delayed
        res = worker.decode_forward(ctx, batch, ids, delayed)
        if read_done:
            self.barrier.after_forward_reads(ctx.device, ctx.forward_stream)
        fmap.publish(batch, res["new_seq_lens"])  # non-spec: unread, no event
        if delayed:
            batch.logits = res["logits"]
            return
        fmap.stash(batch, res["next_tokens"])
        self._copy_to_cpu(batch, {"next_tokens": res["next_tokens"]})

    def delayed_sample(self, batch: Batch) -> None:
        """Step 7 (non-spec grammar): S builds the grammar mask; F waits on S; sample, stash,
        copy."""
        ctx, device, m = self.ctx, self.ctx.device, batch.m
        schedule, forward = ctx.schedule_stream, ctx.forward_stream
        mask = ctx.tmp(batch, "grammar_mask", (m,), I64, schedule)
        mask_values = torch.tensor([len(r.tokens) % 3 for r in batch.reqs], dtype=I64)
        device.launch(schedule, "grammar_mask", lambda: mask_values, writes=[mask],
                      cost_us=ctx.kernel_us)
        device.wait_stream(forward, schedule, SyncLabel.DELAYED_SAMPLING_ENTRY)
        next_ids = ctx.tmp(batch, "next_token_ids", (m,), I64, forward)
        device.launch(forward, "sample", lambda lg, mk: torch.remainder(lg + mk, 997),
                      reads=[batch.logits, mask], writes=[next_ids], cost_us=ctx.kernel_us,
                      observe="sample")
        self.future_map.stash(batch, next_ids)
        self._copy_to_cpu(batch, {"next_tokens": next_ids})

    def _copy_to_cpu(self, batch: Batch, bufs: dict[str, Buffer]) -> None:
        """Non-blocking D2H of the results into pinned memory on F (or on the copy stream,
        after it waits on F), then a NEW copy_done event (step 4i); the debug-check flags
        travel with them. With ``async_d2h`` the host drops each device result right after
        its copy, which only ``record_stream`` on the copying stream keeps alive."""
        ctx, device = self.ctx, self.ctx.device
        batch.copy_done = device.event("copy_done")
        bufs = {**bufs, **batch.flags}
        batch.flags = {}
        stream = ctx.copy_stream or ctx.forward_stream
        if ctx.copy_stream is not None:
            device.wait_stream(stream, ctx.forward_stream, SyncLabel.COPY_STREAM_FORWARD_WAIT)
        for name, src in bufs.items():
            dst = device.buffer(f"{name}_cpu", src.shape, src.dtype, pinned=True)
            device.copy(stream, src, dst, non_blocking=True, cost_us=ctx.d2h_us,
                        name=f"d2h_{name}")
            batch.results[name] = dst
            if ctx.config.async_d2h:
                device.record_stream(src, stream, SyncLabel.D2H_RESULT_RECORD_STREAM)
                if src in batch.pinned:
                    batch.pinned.remove(src)
                device.free(src)
        device.record(batch.copy_done, stream)
