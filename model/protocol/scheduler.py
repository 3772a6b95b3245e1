"""The overlap event loop (PROTOCOL.md §1): barrier, get_next_batch, run_batch, process(n-1).

Iteration n: the WAR barrier (per ``protocol.war_barrier``), ``get_next_batch`` on S (merge,
filter, retract, prefill allocation or spec-v2 ``prepare_for_decode``, SWA writes),
``run_batch`` (resolve seq_lens, the forward-entry fence, gathers, the forward, publish,
stash, copy_to_cpu), then ``pop_and_process(n-1)`` with its host wait on copy_done and its
S side effects (KV frees, SWA clears), then delayed sampling (non-spec grammar).
"""

from __future__ import annotations

import torch

from overlap_harness.model.config import EventKind, Workload
from overlap_harness.model.device import SyncLabel
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.outcome import DebugFailure
from overlap_harness.model.protocol.run_batch import BatchRunner
from overlap_harness.model.protocol.state import Batch, FreeList, Req, request_seed, rows_cols

I64 = torch.int64
DEBUG_FLAGS = (  # (result key, DebugFailure.check, detail) of the async device asserts
    ("assert_flags", "poison_assert", "gather saw -1 (never stashed)"),
    ("seq_lens_flags", "seq_lens_poison", "resolve saw -1 (no fresh publish, #30471)"),
)


class Scheduler:
    """Host-side scheduler state and the per-iteration steps; see the module docstring."""

    def __init__(self, ctx: RunContext, workload: Workload, runner: BatchRunner) -> None:
        self.ctx = ctx
        self.workload = workload
        self.runner = runner
        self.future_map = runner.future_map
        self.barrier = runner.barrier
        self.rows = FreeList(1, ctx.pool_size, "rows")
        self.slots = FreeList(1, ctx.kv_slots, "KV slots", fifo=True)
        self.reqs = [Req(r, request_seed(r.id)) for r in workload.requests]
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.prefilling: list[Req] = []  # admitted, chunks left
        self.last_prefill: list[Req] = []  # to merge at the next get_next_batch
        # SGLang's running_batch.reqs: the last decode batch's requests plus the merged
        # prefills, finished ones left in until the next decode batch filters them
        self.members: list[Req] = []
        self.members_mixed = False  # the last batch was mixed: SGLang merges it filtered
        self.results: list[Batch] = []
        self.last_spec_mixed: Batch | None = None  # its running batch is filtered next
        for r in self.reqs:
            ctx.outcome.request(r.id)

    # -- the loop -------------------------------------------------------------------------
    def iteration(self, n: int) -> None:
        """One pass of the overlap loop."""
        ctx, device = self.ctx, self.ctx.device
        schedule, forward = ctx.schedule_stream, ctx.forward_stream
        device.set_iteration(n)
        self.waiting += [r for r in self.reqs if r.spec.arrive == n]
        self.barrier.at_loop_top(device, schedule, forward)
        batch = self.get_next_batch(n)
        self.runner.run(batch)
        self.barrier.after_launch(device, schedule, forward)
        self.results.append(batch)
        if len(self.results) > 1:
            self._process_queued(self.results.pop(0))
        if ctx.config.delayed_sampling and batch.kind == "decode" and not ctx.is_spec:
            self.runner.delayed_sample(batch)

    def drain(self, n: int) -> None:
        """After the last iteration: process the results still queued."""
        self.ctx.device.set_iteration(n)
        self.future_map.on_loop_end()
        while self.results:
            self._process_queued(self.results.pop(0))

    def _process_queued(self, batch: Batch) -> None:
        """Pop the result queue's oldest batch: process it, then let it go."""
        self.pop_and_process(batch)
        self.ctx.processed(batch)

    # -- get_next_batch_to_run ------------------------------------------------------------
    def get_next_batch(self, n: int) -> Batch:
        """Step 3: merge, filter, retract, then a prefill batch or the decode batch."""
        ctx, device, fmap = self.ctx, self.ctx.device, self.future_map
        device.host_work("schedule_prep", ctx.timing.schedule_prep)
        events = [e for e in self.workload.events if e.at == n]
        if ctx.legacy_verify_done and fmap.verify_done_recorded:
            device.wait_event(ctx.schedule_stream, fmap.verify_done,
                              SyncLabel.VERIFY_DONE_SCHEDULE_WAIT)
        self.running += self.last_prefill
        if self.members_mixed:  # a mixed batch is the running batch, filtered at its merge
            self.members = [r for r in self.members if not r.finished]
            self.members_mixed = False
        self.members += [r for r in self.last_prefill if not r.finished]
        self.last_prefill = []
        self.running = [r for r in self.running if not r.finished]
        self._filter_after_spec_mixed()
        for e in events:
            r = self._req(e.id)
            if e.kind == EventKind.RETRACT and r in self.running:
                self.retract(r, n)
            elif e.kind == EventKind.EVICT_SWA and r in self.running:
                self.clear_swa(r, r.swa_evicted, r.kv_committed, "evict_swa")
        kinds = {e.kind for e in events}
        if EventKind.IDLE in kinds:
            return Batch("idle", n, [])
        batch = self.new_prefill(n)
        if batch is None:
            batch = self.prepare_for_decode(n)
        elif EventKind.MIXED_CHUNK in kinds and self.running:
            return self.mix_with_running(batch)
        return batch

    def mix_with_running(self, pre: Batch) -> Batch:
        """A mixed batch (§9.16): the prefill chunk plus the running decodes, non-spec only.

        S builds ``mix_running_indices`` (the decode part's rows) for F's gather of their
        input ids; ``run_batch`` keeps it alive until then (or not: the #34076 mutation).
        """
        ctx = self.ctx
        if ctx.is_spec and not ctx.config.spec_mixed_batches:
            raise HarnessError(
                f"workload event mixed_chunk at iteration {pre.iteration}: mixed batches need "
                'protocol.mode = "non_spec" (spec-v2 does not mix prefill and decode, §7) or '
                "protocol.spec_mixed_batches = true (SGLang 0.5.23's spec mixed batch)")
        dec = self._spec_tails(pre.iteration) if ctx.is_spec else self.prepare_for_decode(
            pre.iteration)
        mix = ctx.device.buffer("mix_running_indices", (dec.m,), I64, stream=ctx.schedule_stream)
        rows = torch.tensor(dec.rows, dtype=I64)
        ctx.device.launch(ctx.schedule_stream, "mix_running_indices", lambda: rows, writes=[mix],
                          cost_us=ctx.kernel_us)
        batch = Batch("mixed", pre.iteration, pre.reqs + dec.reqs, parts=(pre, dec),
                      mix_idx=mix)
        self.members_mixed = True
        if ctx.is_spec:
            self.last_spec_mixed = batch
        return batch

    def _spec_tails(self, n: int) -> Batch:
        """The decode part of a spec mixed batch: one token per running request at its
        committed length, which only the device knows yet (late-bound in run_batch); the
        previous verify's over-allocation covers it, grown here only if it would not."""
        ctx, device = self.ctx, self.ctx.device
        tail = Batch("tail", n, list(self.running))
        ranges = [self.grow(r, r.kv_committed + ctx.num_draft_tokens + 1) for r in tail.reqs]
        self.write_alloc(tail.reqs, ranges, "mix_alloc")
        tail.slots_in = tail.slots_out = tail.rows
        # mix_with_running's tail_base (schedule_batch.py 3293-3297): torch.tensor(list,
        # device=...) is a blocking copy on S, so the host waits for S's work so far
        staged = device.buffer("tail_base_host", (tail.m,), I64, pinned=True)
        device.host_write(staged, None, torch.tensor([max(r.kv_committed - 1, 0)
                                                      for r in tail.reqs], dtype=I64),
                          name="stage_tail_base")
        base = ctx.tmp(tail, "tail_base", (tail.m,), I64, ctx.schedule_stream)
        device.copy(ctx.schedule_stream, staged, base, non_blocking=False,
                    cost_us=ctx.d2h_us, name="tail_base")
        device.free(staged)
        return tail

    def _filter_after_spec_mixed(self) -> None:
        """``filter_batch`` of the running batch a spec mixed batch left (schedule_batch.py
        3866-3878): when a request leaves it (a chunk still in prefill, a finished one), S
        indexes that batch's ``seq_lens``, which the mixed batch's tails wrote on F."""
        mixed, self.last_spec_mixed = self.last_spec_mixed, None
        if mixed is None or mixed.seq_lens is None:
            return
        keep = [i for i, r in enumerate(mixed.reqs) if r in self.running]
        if len(keep) == mixed.m:
            return
        ctx = self.ctx
        kept = ctx.device.buffer("filtered_seq_lens", (len(keep),), I64,
                                 stream=ctx.schedule_stream)
        ctx.device.launch(ctx.schedule_stream, "filter_batch_seq_lens", lambda s: s[keep],
                          reads=[(mixed.seq_lens, keep)], writes=[kept],
                          cost_us=ctx.kernel_us)
        ctx.device.free(kept)  # dead: the next decode resolves its lengths from the relay
        # the mixed batch's own seq_lens is not freed: the model reuses no block of it

    def _finishing_inflight(self) -> list[Req]:
        """With ``skip_finishing_decode`` (non-spec): the requests whose result, queued and not
        yet processed, gives them their last token by length; SGLang leaves them out of the
        next decode batch instead of decoding them once more."""
        if not self.ctx.config.skip_finishing_decode or self.ctx.is_spec or not self.results:
            return []
        queued = self.results[-1]
        finishing = []
        for part in queued.parts or (queued,):
            for i, r in enumerate(part.reqs):
                gives_token = part.kind == "decode" or (
                    part.kind == "prefill" and part.last_chunk[i])
                if gives_token and not r.finished and len(r.tokens) + 1 >= r.spec.max_new:
                    finishing.append(r)
        return finishing

    def _late_finishes(self) -> set[str]:
        """Requests a ``finish_late`` event finishes while this iteration processes results."""
        n = self.ctx.device.iteration
        return {e.id for e in self.workload.events if e.kind == EventKind.FINISH_LATE and e.at == n}

    def _req(self, rid: str) -> Req:
        return next((r for r in self.reqs if r.id == rid), Req(self.reqs[0].spec, 0))

    def retract(self, r: Req, n: int) -> None:
        """Spec retracts from the back: free the row and KV on S; the request re-queues."""
        self.running.remove(r)
        if r in self.members:
            self.members.remove(r)
        self.release(r, "retract_release")
        r.prefilled = r.chunk = 0
        r.ready_at = n + 1  # its result of n-1 is processed first
        self.waiting.append(r)
        self.ctx.outcome.request(r.id).retracted_at.append(n)

    def release(self, r: Req, op: str) -> None:
        """Free a request's KV slots and row: on S, read its slot ids; with SWA, clear them."""
        ctx = self.ctx
        if r.row is None:
            return
        sel = rows_cols([r.row], [(0, r.alloc)], ctx.max_context)
        if ctx.swa_map is not None:
            slots = list(r.slots)
            ctx.device.launch(ctx.schedule_stream, op,
                              lambda r2t: torch.zeros(len(slots), dtype=I64, device=r2t.device),
                              reads=[(ctx.req_to_token, sel)], writes=[(ctx.swa_map, slots)],
                              cost_us=ctx.kernel_us)
        else:
            ctx.device.launch(ctx.schedule_stream, op, lambda r2t: None,
                              reads=[(ctx.req_to_token, sel)], cost_us=ctx.kernel_us)
        self.slots.free(r.slots)
        self.rows.free([r.row])
        r.row, r.slots, r.swa_evicted = None, [], 0

    def clear_swa(self, r: Req, lo: int, hi: int, op: str) -> None:
        """SWA eviction on S: clear ``full_to_swa_index_mapping`` for positions [lo, hi)."""
        ctx = self.ctx
        if ctx.swa_map is None or hi <= lo:
            return
        slots = r.slots_at(lo, hi)
        zeros = torch.zeros(len(slots), dtype=I64)  # host constant, staged by the device
        ctx.device.launch(ctx.schedule_stream, op, lambda: zeros,
                          writes=[(ctx.swa_map, slots)], cost_us=ctx.kernel_us)
        r.swa_evicted = max(r.swa_evicted, hi)

    def grow(self, r: Req, new_alloc: int) -> tuple[int, int]:
        """Host slot alloc up to ``new_alloc`` columns; returns the new columns [cur, nxt)."""
        cur = r.alloc
        nxt = min(max(cur, new_alloc), self.ctx.max_context)
        if nxt > cur:
            r.slots += self.slots.alloc(nxt - cur)
        return cur, nxt

    def write_alloc(self, reqs: list[Req], ranges: list[tuple[int, int]], op: str) -> None:
        """On S: ``req_to_token[row, cur:nxt] = slots`` (and SWA mapping entries) per request."""
        ctx = self.ctx
        vals = [s for r, (a, b) in zip(reqs, ranges, strict=True) for s in r.slots[a:b]]
        if not vals:
            return
        sel = rows_cols([r.row or 0 for r in reqs], ranges, ctx.max_context)
        v = torch.tensor(vals, dtype=I64)
        writes: list = [(ctx.req_to_token, sel)]
        if ctx.swa_map is not None:
            writes.append((ctx.swa_map, vals))
            sw = torch.remainder(v * 7 + 1, ctx.kv_slots) + 1
            ctx.device.launch(ctx.schedule_stream, op, lambda: (v, sw), writes=writes,
                              cost_us=ctx.kernel_us)
        else:
            ctx.device.launch(ctx.schedule_stream, op, lambda: v, writes=writes,
                              cost_us=ctx.kernel_us)

    def new_prefill(self, n: int) -> Batch | None:
        """Admit waiting requests (and continue chunked ones) into a prefill batch."""
        ctx = self.ctx
        todo = list(self.prefilling)
        self.waiting = [r for r in self.waiting if not r.finished]
        ready = [r for r in self.waiting if r.ready_at <= n]
        budget = self._admission_budget()
        while ready and len(self.rows) > 0 and budget > 0:
            budget -= 1
            r = ready.pop(0)
            self.waiting.remove(r)
            r.row = self.rows.alloc()[0]
            r.fslot = r.row
            r.target_len = len(r.input_tokens())
            r.prefilled = r.chunk = 0
            todo.append(r)
        if not todo:
            return None
        batch = Batch("prefill", n, todo)
        ranges = []
        for r in todo:
            left = r.spec.chunks - r.chunk
            size = -(-(r.target_len - r.prefilled) // left)
            s, e = r.prefilled, min(r.target_len, r.prefilled + size)
            batch.chunk_starts.append(s)
            batch.chunk_ends.append(e)
            batch.last_chunk.append(e >= r.target_len)
            ranges.append(self.grow(r, e + ctx.alloc_len))
        if ctx.config.prefill_rewrites_prefix:  # the prefix's entries written again
            ranges = [(0, end) for _, end in ranges]
        self.write_alloc(todo, ranges, "prefill_alloc")
        self.future_map.build_indices(batch, "build_future_indices")
        toks = [t for r, s, e in zip(todo, batch.chunk_starts, batch.chunk_ends, strict=True)
                for t in r.input_tokens()[s:e]]
        staged = ctx.device.buffer("prefill_ids_pinned", (len(toks),), I64, pinned=True)
        ctx.device.host_write(staged, None, torch.tensor(toks, dtype=I64), name="stage_input_ids")
        batch.results["staged_ids"] = staged
        lens = torch.tensor(batch.chunk_ends, dtype=I64)
        batch.seq_lens = ctx.tmp(batch, "seq_lens", (batch.m,), I64, ctx.schedule_stream)
        ctx.device.launch(ctx.schedule_stream, "build_seq_lens", lambda: lens,
                          writes=[batch.seq_lens], cost_us=ctx.kernel_us)
        for r, e, last in zip(todo, batch.chunk_ends, batch.last_chunk, strict=True):
            r.prefilled, r.chunk = e, r.chunk + 1
            if last:
                r.kv_committed = e
        self.prefilling = [r for r, last in zip(todo, batch.last_chunk, strict=True) if not last]
        self.last_prefill = [r for r, last in zip(todo, batch.last_chunk, strict=True) if last]
        return batch

    def _admission_budget(self) -> int:
        """How many waiting requests a prefill may admit beside the free rows: with
        ``max_running_requests``, that many minus SGLang's running batch as it stands before
        the decode step filters it (requests whose finish was processed since still count);
        no limit while a chunked prefill continues (SGLang skips the check then)."""
        cap = self.ctx.config.max_running_requests
        if not cap or self.prefilling:
            return len(self.waiting)
        return cap - len(self.members)

    def prepare_for_decode(self, n: int) -> Batch:
        """The decode batch: SWA eviction, over-allocation, ``req_to_token[row, cur:nxt]`` on S."""
        ctx = self.ctx
        finishing = self._finishing_inflight()
        reqs = [r for r in self.running if r not in finishing]
        self.members = list(reqs)  # update_running_batch: finished and finishing filtered
        batch = Batch("decode", n, reqs)
        ranges = []
        for r in reqs:
            if ctx.swa_map is not None:
                self.clear_swa(r, r.swa_evicted, r.kv_committed - ctx.swa_window, "swa_evict")
            if ctx.is_spec:
                over = ctx.config.alloc_factor * ctx.alloc_len  # 2x at REF (§7 over-allocation)
                ranges.append(self.grow(r, r.kv_committed + over))
            else:
                ranges.append(self.grow(r, r.kv_committed + 1))
        self.write_alloc(reqs, ranges, "prepare_for_decode")
        if reqs:
            self.future_map.build_indices(batch, "merge_filter_indices")
        if not ctx.is_spec:  # non-spec: a NEW seq_lens tensor from the host's lengths
            batch.host_lens = [r.kv_committed for r in reqs]
            lens = torch.tensor(batch.host_lens, dtype=I64)
            batch.seq_lens = ctx.tmp(batch, "seq_lens", (batch.m,), I64, ctx.schedule_stream)
            ctx.device.launch(ctx.schedule_stream, "build_seq_lens", lambda: lens,
                              writes=[batch.seq_lens], cost_us=ctx.kernel_us)
            for r in reqs:
                r.kv_committed += 1  # the host knows non-spec lengths exactly
        return batch

    # -- run_batch ------------------------------------------------------------------------
    # -- pop_and_process ------------------------------------------------------------------
    def pop_and_process(self, batch: Batch) -> None:
        """Step 6: the host waits copy_done, reads the results, frees finished requests on S.

        A request already finished is found in the batch launched after its finish (§7: it
        "stays in batch n"): its result is skipped and the skip recorded in ``skipped_at``.
        A ``finish_late`` event at the current iteration makes the host find its request
        finished here (a stop condition, not ``max_new``), after the batch that still holds it
        was launched.
        """
        ctx, device = self.ctx, self.ctx.device  # results read as lists: cheaper to index
        if batch.parts:  # mixed: each part has its results and copy_done
            for part in batch.parts:
                self.pop_and_process(part)
            return
        assert batch.copy_done is not None
        empty = batch.kind == "idle" or batch.m == 0
        if not (empty and ctx.config.idle_result_sync
                and not device.sync_enabled(SyncLabel.COPY_DONE_IDLE_HOST_SYNC)):
            device.synchronize(batch.copy_done, SyncLabel.COPY_DONE_HOST_SYNC)
        device.host_work("process_results", ctx.timing.process_results)
        vals = {k: device.host_read(b, name=f"read_{k}").tolist() for k, b in batch.results.items()}
        for i, r in enumerate(batch.reqs):
            out = ctx.outcome.request(r.id)
            for flag, check, what in DEBUG_FLAGS:
                if flag in vals and int(vals[flag][i]):
                    ctx.outcome.debug_failures.append(DebugFailure(batch.iteration, r.id,
                                                                   check, what))
            if r.finished:
                out.skipped_at.append(batch.iteration)  # found finished late: skipped
                continue
            if batch.kind == "prefill" and not batch.last_chunk[i]:
                continue  # intermediate chunk
            if batch.kind == "decode" and ctx.is_spec:
                a = int(vals["accept_lens"][i])
                new = [int(t) for t in vals["out_tokens"][i][:a]]
                out.accept_lens[batch.iteration] = a
                r.kv_committed += a
            else:
                new = [int(vals["next_tokens"][i])]
            if batch.kind == "tail":  # a spec mixed batch's decode tail: one token
                r.kv_committed += 1
            left = r.spec.max_new - len(r.tokens)
            r.tokens += new[:left]
            out.tokens = list(r.tokens)
            if len(r.tokens) >= r.spec.max_new or r.id in self._late_finishes():
                r.finished = True
                out.finished_at = batch.iteration
                self.release(r, "release_kv")
        if ctx.config.radix_cache_rewrite and batch.kind == "prefill":
            kept = [r for r in batch.reqs if not r.finished and r.prefilled]
            if kept:
                self.write_alloc(kept, [(0, r.prefilled) for r in kept],
                                 "cache_unfinished_req")
        for b in batch.results.values():
            device.free(b)
        batch.results = {}
