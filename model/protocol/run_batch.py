"""Step 4, ``run_batch`` (PROTOCOL.md §1): resolve, the forward-entry fence, the gathers, the
forward on F, publish, stash, copy_to_cpu and the pin ring; and step 7, delayed sampling.

A mixed batch (non-spec, §7 and §9.16) is a prefill chunk plus the running decodes: S builds
``mix_running_indices`` while scheduling, F gathers ``output_tokens_buf[mix_running_indices]``
for the decode part, and the index tensor is kept alive until that gather by the
``mix_running_indices.keep_alive`` label (``record_stream(F)`` plus the pin ring, as SGLang's
``extra_keep_alive_refs``). Removed, the host drops it when run_batch returns and the
allocator may hand its block to the next S allocation while F's gather is still pending.
"""

from __future__ import annotations

import torch

from model.config import WarBarrier
from model.device import Buffer, SyncLabel
from model.protocol import future_map as fm
from model.protocol import worker
from model.protocol.context import Ctx
from model.protocol.outcome import DebugFailure
from model.protocol.state import Batch

L = SyncLabel
I64 = torch.int64


def run_batch(ctx: Ctx, batch: Batch) -> None:
    """Step 4: resolve, fence, gather, forward, publish, stash, copy_to_cpu, pin."""
    dev = ctx.dev
    ctx.outcome.batches[batch.iteration] = batch.ids
    ctx.outcome.batch_kinds[batch.iteration] = batch.kind
    if batch.kind == "decode" and batch.m and ctx.spec:
        _resolve(ctx, batch)
    dev.wait_stream(ctx.F, ctx.S, L.FORWARD_ENTRY)
    if batch.kind != "decode" or ctx.spec:
        _flush_pending_stash(ctx)
    plan = _plan(ctx, batch) if ctx.PL is not None and batch.m else None
    if batch.kind == "idle" or batch.m == 0:
        dev.launch(ctx.F, "idle_forward", lambda: None, cost_us=ctx.k_us)
        batch.copy_done = dev.event("copy_done")
        dev.record(batch.copy_done, ctx.F)
    elif batch.kind == "prefill":
        _run_prefill(ctx, batch)
    elif batch.kind == "mixed":
        _run_mixed(ctx, batch)
    elif ctx.spec:
        _run_spec_decode(ctx, batch, plan)
    else:
        _run_decode(ctx, batch)
    ctx.pin(batch)
    if batch.mix_idx is not None and not batch.mix_idx.freed and batch.mix_idx not in batch.pinned:
        ctx.dev.free(batch.mix_idx)  # keep-alive removed: the last host reference goes now


def _resolve(ctx: Ctx, batch: Batch) -> None:
    """Step 4a plus the host's use of it: the lengths it declares accesses with."""
    fm.check_ring(ctx, batch)
    cpu = fm.resolve_seq_lens_cpu(ctx, batch)
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


def _plan(ctx: Ctx, batch: Batch) -> Buffer:
    """Plan stream: metadata for verify from seq_lens; F waits on PL afterwards."""
    dev = ctx.dev
    assert ctx.PL is not None and batch.seq_lens is not None
    dev.wait_stream(ctx.PL, ctx.S, L.PLAN_SCHEDULE_WAIT)
    meta = ctx.tmp(batch, "plan_metadata", (batch.m,), I64, ctx.PL)
    dev.launch(ctx.PL, "plan_metadata", lambda s: s + ctx.N, reads=[batch.seq_lens],
               writes=[meta], cost_us=ctx.k_us)
    dev.wait_stream(ctx.F, ctx.PL, L.PLAN_WAIT)
    return meta


def _run_prefill(ctx: Ctx, batch: Batch) -> None:
    """Prefill (or one chunk): ids by H2D on F, forward, publish (spec), stash, copy."""
    dev = ctx.dev
    staged = batch.results.pop("staged_ids")
    ids = ctx.tmp(batch, "prefill_input_ids", staged.shape, I64, ctx.F)
    dev.copy(ctx.F, staged, ids, non_blocking=True, cost_us=ctx.d2h_us, name="h2d_input_ids")
    res = worker.prefill_forward(ctx, batch, ids)
    if ctx.spec:
        fm.publish(ctx, batch, res["new_seq_lens"])
        res = worker.draft_prefill(ctx, batch, res)
        fm.stash(ctx, batch, res["next_tokens"], res["next_topk_p"], res["next_topk_index"],
                 res.get("next_hidden"))
    else:
        fm.stash(ctx, batch, res["next_tokens"])
    fm.copy_to_cpu(ctx, batch, {"next_tokens": res["next_tokens"]})


def _run_spec_decode(ctx: Ctx, batch: Batch, plan: Buffer | None) -> None:
    """Spec-v2 decode: gather, draft and verify, publish, draft-extend, stash, copy."""
    dev = ctx.dev
    x = fm.gather_spec_inputs(ctx, batch)
    res = worker.spec_draft_verify(ctx, batch, x, plan)
    after_verify = ctx.cfg.publish_point.value == "after_verify"
    if after_verify:
        fm.publish(ctx, batch, res["new_seq_lens"])
    if ctx.barrier == WarBarrier.READ_DONE:
        ctx.read_done = dev.event("read_done")
        dev.record(ctx.read_done, ctx.F)
    res = worker.draft_extend(ctx, batch, res)
    if not after_verify:
        fm.publish(ctx, batch, res["new_seq_lens"])
    fm.stash(ctx, batch, res["next_tokens"], res["next_topk_p"], res["next_topk_index"],
             res.get("next_hidden"))
    keys = ("next_tokens", "accept_lens", "out_tokens")
    fm.copy_to_cpu(ctx, batch, {k: res[k] for k in keys})


def _run_mixed(ctx: Ctx, batch: Batch) -> None:
    """A prefill chunk plus the running decodes (non-spec): the decode part's ids come from
    ``output_tokens_buf[mix_running_indices]`` on F, the prefill part's by H2D."""
    pre, dec = batch.parts
    mix = batch.mix_idx
    assert mix is not None
    if ctx.dev.sync_enabled(L.MIX_INDICES_KEEP_ALIVE):
        ctx.dev.record_stream(mix, ctx.F)
        batch.pinned.append(mix)
    ids = fm.gather_output_tokens(ctx, dec, mix)
    _run_prefill(ctx, pre)
    _run_decode(ctx, dec, ids, delayed=False)
    batch.pinned += pre.pinned + dec.pinned
    batch.copy_done = dec.copy_done


def _run_decode(ctx: Ctx, batch: Batch, ids: Buffer | None = None,
                delayed: bool | None = None) -> None:
    """Non-spec decode: gather the input ids (unless given), forward, publish, stash, copy."""
    if ids is None:
        ids = fm.gather_output_tokens(ctx, batch)
    _flush_pending_stash(ctx)
    delayed = ctx.cfg.delayed_sampling if delayed is None else delayed
    res = worker.decode_forward(ctx, batch, ids, delayed)
    if ctx.barrier == WarBarrier.READ_DONE:
        ctx.read_done = ctx.dev.event("read_done")
        ctx.dev.record(ctx.read_done, ctx.F)
    fm.publish(ctx, batch, res["new_seq_lens"])  # non-spec: unread, no event
    if delayed:
        batch.logits = res["logits"]
        return
    fm.stash(ctx, batch, res["next_tokens"])
    fm.copy_to_cpu(ctx, batch, {"next_tokens": res["next_tokens"]})


def _flush_pending_stash(ctx: Ctx) -> None:
    if ctx.pending_stash is not None:
        ctx.pending_stash()
        ctx.pending_stash = None


def delayed_sample(ctx: Ctx, batch: Batch) -> None:
    """Step 7 (non-spec grammar): S builds the grammar mask; F waits on S; sample, stash, copy.

    With ``delayed_stash_after_gather`` the stash is enqueued after the next gather
    (§9.24's bug) instead of here.
    """
    dev, m = ctx.dev, batch.m
    mask = ctx.tmp(batch, "grammar_mask", (m,), I64, ctx.S)
    mv = torch.tensor([len(r.tokens) % 3 for r in batch.reqs], dtype=I64)
    dev.launch(ctx.S, "grammar_mask", lambda: mv, writes=[mask], cost_us=ctx.k_us)
    dev.wait_stream(ctx.F, ctx.S, L.DELAYED_SAMPLING_ENTRY)
    nxt = ctx.tmp(batch, "next_token_ids", (m,), I64, ctx.F)
    dev.launch(ctx.F, "sample", lambda lg, mk: torch.remainder(lg + mk, 997),
               reads=[batch.logits, mask], writes=[nxt], cost_us=ctx.k_us, observe="sample")
    if ctx.cfg.delayed_stash_after_gather:
        ctx.pending_stash = lambda: fm.stash(ctx, batch, nxt)
    else:
        fm.stash(ctx, batch, nxt)
    fm.copy_to_cpu(ctx, batch, {"next_tokens": nxt})
