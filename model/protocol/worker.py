"""The forwards on F: prefill, spec-v2 decode (draft, verify, draft-extend), non-spec decode.

Each op declares its accesses element-precisely from the host's knowledge (the row's slot
mirror, the resolved seq_lens) and computes its values from the device values it read, so a
stale seq_len or slot id gives a wrong value while the declared accesses stay what the program
meant. Where the host does not know the exact seq_len (the backend opted out of
``seq_lens_cpu``) it declares the window the device value must lie in.

The op functions are device code: on ``CudaDevice`` they run at issue on live CUDA tensors, so
they are vectorised torch ops on their inputs' device, with host-known values (rows, chunk
bounds, declared positions) captured as Python ints and moved to the device by
:func:`synth.ints` (asynchronously on a GPU); no value leaves the device.
"""

from __future__ import annotations

import torch

from overlap_harness.model.device import Buffer, Stream
from overlap_harness.model.protocol import synth
from overlap_harness.model.protocol.context import RunContext
from overlap_harness.model.protocol.state import Batch, Req, rows_cols
from overlap_harness.model.protocol.synth import clamp_index

I64 = torch.int64


def windows(ctx: RunContext, batch: Batch, width: int) -> list[tuple[int, int]]:
    """Per request, positions ``[lo, hi)`` a read or write of ``width`` from seq_len may touch."""
    if batch.exact_lens:
        return [(n, n + width) for n in batch.host_lens]
    return [(n, n + ctx.num_draft_tokens + width) for n in batch.host_lens]


def ctx_hi(ctx: RunContext, batch: Batch) -> list[int]:
    """Per request, the end of the context positions attention may read."""
    return [n if batch.exact_lens else n + ctx.num_draft_tokens for n in batch.host_lens]


def _ctx_reads(ctx: RunContext, batch: Batch, his: list[int]) -> list:
    """Attention's reads: req_to_token[row, :L], the KV in those slots, the SWA window."""
    rows = batch.rows
    reads: list = [(ctx.req_to_token, rows_cols(rows, [(0, h) for h in his], ctx.max_context))]
    slots = [s for r, h in zip(batch.reqs, his, strict=True) for s in r.slots_at(0, h)]
    reads.append((ctx.kv_cache, slots))
    if ctx.swa_map is not None:
        w = ctx.swa_window
        ws = [s for r, h in zip(batch.reqs, his, strict=True) for s in r.slots_at(max(0, h - w), h)]
        reads.append((ctx.swa_map, ws))
    return reads


def _write_slots(reqs: list[Req], wins: list[tuple[int, int]]) -> list[int]:
    return [s for r, (lo, hi) in zip(reqs, wins, strict=True) for s in r.slots_at(lo, hi)]


def _positions(wins: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Per declared element of a windowed write: its position and its request index."""
    pos = [p for lo, hi in wins for p in range(lo, hi)]
    own = [i for i, (lo, hi) in enumerate(wins) for _ in range(lo, hi)]
    return pos, own


def prefill_forward(ctx: RunContext, batch: Batch, ids: Buffer) -> dict[str, Buffer]:
    """Target prefill of each request's chunk ``[start, end)``: KV writes and the next token."""
    device, forward, m = ctx.device, ctx.forward_stream, batch.m
    starts, ends, rows = batch.chunk_starts, batch.chunk_ends, batch.rows
    nxt = ctx.tmp(batch, "next_token_ids", (m,), I64, forward)
    nsl = ctx.tmp(batch, "new_seq_lens", (m,), I64, forward)
    wins = list(zip(starts, ends, strict=True))
    wslots = _write_slots(batch.reqs, wins)
    reads = [ids, *_ctx_reads(ctx, batch, ends), (ctx.kv_cache, wslots)]
    swa, w = ctx.swa_map is not None, ctx.swa_window

    pos, own = _positions(wins)
    lasts = [sum(e - s for s, e in wins[:i + 1]) - 1 for i in range(m)]
    cols, ns = ctx.max_context, ctx.kv_slots

    def fn(ids_v, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        dv = ids_v.device
        p_t = synth.ints(pos, dv)
        o_t = synth.ints(own, dv)
        row_t = synth.ints(rows, dv)[o_t]
        slots = clamp_index(r2t[row_t, clamp_index(p_t, cols)], ns)
        vals = synth.kv_value(ids_v, p_t, slots)
        lens = synth.ints(ends, dv)
        c = synth.context_hashes(r2t, kv, rows, lens, swa_v, w, (slots, vals, o_t))
        last = ids_v[synth.ints(lasts, dv)]
        return vals, synth.next_token(last, lens, c), lens

    device.launch(forward, "prefill_forward", fn, reads=reads,
                  writes=[(ctx.kv_cache, wslots), nxt, nsl],
                  cost_us=ctx.draft_us + ctx.verify_us, observe="prefill_forward")
    return {"next_tokens": nxt, "new_seq_lens": nsl}


def draft_prefill(ctx: RunContext, batch: Batch, res: dict[str, Buffer]) -> dict[str, Buffer]:
    """The draft model's prefill: first top-k and hidden states (real probabilities)."""
    return _extend(ctx, batch, res, "draft_prefill", ones=False)


def _extend(
    ctx: RunContext, batch: Batch, res: dict[str, Buffer], name: str, ones: bool,
    lengths: Buffer | None = None,
) -> dict[str, Buffer]:
    device, forward, m = ctx.device, ctx.forward_stream, batch.m
    k, h = ctx.topk, ctx.config.hidden_size
    tp = ctx.tmp(batch, "next_topk_p", (m, k), torch.float32, forward)
    ti = ctx.tmp(batch, "next_topk_index", (m, k), I64, forward)
    writes = [tp, ti]
    hid = None
    if ctx.config.hidden_states:
        hid = ctx.tmp(batch, "next_hidden", (m, h), torch.float32, forward)
        writes.append(hid)

    def fn(tok, lens, *_prepared_lengths):
        p, ids = synth.next_topk(tok, lens, k, ones and k == 1)
        if hid is None:
            return p, ids
        return p, ids, synth.next_hidden(tok, lens, h)

    reads = [res["next_tokens"], res["new_seq_lens"]] + ([lengths] if lengths is not None else [])
    device.launch(forward, name, fn, reads=reads, writes=writes, cost_us=ctx.extend_us)
    out = dict(res)
    out.update(next_topk_p=tp, next_topk_index=ti)
    if hid is not None:
        out["next_hidden"] = hid
    return out


def spec_draft(ctx: RunContext, batch: Batch, x: dict[str, Buffer | None],
               verify_loc: bool = True) -> tuple[Buffer, Buffer | None]:
    """The draft on F: ``out_cache_loc`` from ``req_to_token``, the multi-step draft and its
    tree; then verify's ``out_cache_loc`` (unless ``verify_loc`` is false: the plan stream
    builds it). The two copies out of ``req_to_token`` stand for a graph runner's
    ``replay_prepare`` metadata reads. Returns (draft tokens, verify's ``out_cache_loc`` or
    None)."""
    device, forward, m = ctx.device, ctx.forward_stream, batch.m
    N, ts = ctx.num_draft_tokens, ctx.draft_kv_width
    rows, sl = batch.rows, batch.seq_lens
    assert sl is not None
    docl = ctx.tmp(batch, "draft_out_cache_loc", (m, ts), I64, forward)
    device.launch(forward, "draft_out_cache_loc", lambda s, r2t: synth.take_cols(r2t, rows, s, ts),
                  reads=[sl, (ctx.req_to_token,
                              rows_cols(rows, windows(ctx, batch, ts), ctx.max_context))],
                  writes=[docl], cost_us=ctx.kernel_us, observe="draft_out_cache_loc")
    drafts = ctx.tmp(batch, "draft_tokens", (m, N - 1), I64, forward)
    has_h = x.get("hidden") is not None
    steps = ctx.config.num_steps

    def draft(bonus, tp, ti, s, ocl, *hs):
        sc, tk, par = synth.draft_steps(bonus, tp, ti, hs[0] if hs else None, s, ocl, steps)
        return ctx.organizer.draft_tokens(sc, tk, par)

    dreads = [x["bonus"], x["topk_p"], x["topk_index"], sl, docl]
    dreads += [x["hidden"]] if has_h else []
    device.launch(forward, "draft", draft, reads=dreads, writes=[drafts], cost_us=ctx.draft_us)
    return drafts, verify_out_cache_loc(ctx, batch, forward) if verify_loc else None


def verify_out_cache_loc(ctx: RunContext, batch: Batch, stream: Stream) -> Buffer:
    """Verify's ``out_cache_loc`` on ``stream``: the ``num_draft_tokens`` slots from each
    request's seq_len, read out of ``req_to_token``."""
    rows, sl, N = batch.rows, batch.seq_lens, ctx.num_draft_tokens
    assert sl is not None
    vocl = ctx.tmp(batch, "out_cache_loc", (batch.m, N), I64, stream)
    ctx.device.launch(stream, "verify_out_cache_loc",
                      lambda s, r2t: synth.take_cols(r2t, rows, s, N),
                      reads=[sl, (ctx.req_to_token,
                                  rows_cols(rows, windows(ctx, batch, N), ctx.max_context))],
                      writes=[vocl], cost_us=ctx.kernel_us, observe="verify_out_cache_loc")
    return vocl


def spec_verify(ctx: RunContext, batch: Batch, bonus: Buffer | None, drafts: Buffer,
                vocl: Buffer, plan: Buffer | None) -> dict[str, Buffer]:
    """Verify on F: the target forward over bonus + drafts, its KV writes, accept lengths,
    the next bonus token and the new seq_lens."""
    device, forward, m, N = ctx.device, ctx.forward_stream, batch.m, ctx.num_draft_tokens
    rows, sl = batch.rows, batch.seq_lens
    names = ("next_tokens", "accept_lens", "new_seq_lens")
    res = {n: ctx.tmp(batch, n, (m,), I64, forward) for n in names}
    out_tok = ctx.tmp(batch, "out_tokens", (m, N), I64, forward)
    wins = windows(ctx, batch, N)
    wslots = _write_slots(batch.reqs, wins)
    reads = [bonus, drafts, sl, vocl, *_ctx_reads(ctx, batch, ctx_hi(ctx, batch)),
             (ctx.kv_cache, wslots)]
    if plan is not None:
        reads.append(plan)
    swa, w = ctx.swa_map is not None, ctx.swa_window

    pos, own = _positions(wins)

    def fn(b, d, s, ocl, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        kv_old = rest[1] if swa else rest[0]
        dv = b.device
        n0 = s.to(I64)
        c = synth.context_hashes(r2t, kv, rows, n0, swa_v, w)
        if plan is not None:
            c = synth.mix(c, rest[-1])
        inp = torch.cat([b.to(I64)[:, None], d.to(I64)], dim=1)  # (m, N)
        a = synth.accept_len(inp, n0, c, N)
        nb = synth.next_token(inp.gather(1, (a - 1)[:, None])[:, 0], n0 + a, c)
        j = torch.arange(N, dtype=I64, device=dv)[None, :]
        vals = synth.kv_value(inp, n0[:, None] + j, ocl)
        kvw = synth.overlay(kv_old[synth.ints(wslots, dv)], pos, own,
                            n0, vals)
        drafts = torch.cat([inp[:, 1:], torch.full_like(inp[:, :1], -1)], dim=1)
        acc = (a - 1)[:, None]
        outs = torch.where(j < acc, drafts, torch.where(j == acc, nb[:, None], -1))
        return kvw, nb, a, n0 + a, outs

    device.launch(forward, "verify", fn, reads=reads,
                  writes=[(ctx.kv_cache, wslots), res["next_tokens"], res["accept_lens"],
                       res["new_seq_lens"], out_tok],
                  cost_us=ctx.verify_us, observe="verify")
    res["out_tokens"] = out_tok
    return res


def draft_extend(ctx: RunContext, batch: Batch, res: dict[str, Buffer],
                 lengths: Buffer | None = None) -> dict[str, Buffer]:
    """draft_extend_for_decode on F: next top-k and hidden states from verify's outputs;
    ``lengths``: the extend lengths the plan stream prepared, read too."""
    return _extend(ctx, batch, res, "draft_extend", ones=True, lengths=lengths)


def decode_forward(ctx: RunContext, batch: Batch, ids: Buffer, delayed: bool) -> dict[str, Buffer]:
    """Non-spec decode: one token per request at position L (slot req_to_token[row, L]).

    With delayed sampling it writes logits only; sampling happens later (step 7).
    """
    device, forward, m, rows = ctx.device, ctx.forward_stream, batch.m, batch.rows
    sl = batch.seq_lens
    assert sl is not None
    out = ctx.tmp(batch, "logits" if delayed else "next_token_ids", (m,), I64, forward)
    nsl = ctx.tmp(batch, "new_seq_lens", (m,), I64, forward)
    wins = [(n, n + 1) for n in batch.host_lens]
    wslots = _write_slots(batch.reqs, wins)
    his = [n + 1 for n in batch.host_lens]
    swa, w = ctx.swa_map is not None, ctx.swa_window

    pos, own = _positions(wins)
    ns = ctx.kv_slots

    def fn(tok, s, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        dv = tok.device
        n0 = s.to(I64)
        slot = clamp_index(synth.take_cols(r2t, rows, n0, 1)[:, 0], ns)
        v = synth.kv_value(tok, n0, slot)
        mine = torch.arange(m, dtype=I64, device=dv)
        c = synth.context_hashes(r2t, kv, rows, n0 + 1, swa_v, w, (slot, v, mine))
        kvw = synth.overlay(kv[synth.ints(wslots, dv)], pos, own, n0,
                            v[:, None])
        return kvw, synth.next_token(tok, n0 + 1, c), s + 1

    reads = [ids, sl, *_ctx_reads(ctx, batch, his)]
    device.launch(forward, "decode_forward", fn, reads=reads,
                  writes=[(ctx.kv_cache, wslots), out, nsl],
                  cost_us=ctx.draft_us + ctx.verify_us + ctx.extend_us, observe="decode_forward")
    return {"logits" if delayed else "next_tokens": out, "new_seq_lens": nsl}
