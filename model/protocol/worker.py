"""The forwards on F: prefill, spec-v2 decode (draft, verify, draft-extend), non-spec decode.

Each op declares its accesses element-precisely from the host's knowledge (the row's slot
mirror, the resolved seq_lens) and computes its values from the device values it read, so a
stale seq_len or slot id gives a wrong value while the declared accesses stay what the program
meant. Where the host does not know the exact seq_len (the backend opted out of
``seq_lens_cpu``) it declares the window the device value must lie in.
"""

from __future__ import annotations

import torch

from model.device import Buffer
from model.protocol import synth
from model.protocol.context import Ctx
from model.protocol.state import Batch, Req, rows_cols
from model.protocol.synth import clamp_index

I64 = torch.int64


def _take(r2t: torch.Tensor, row: int, start: torch.Tensor | int, width: int) -> torch.Tensor:
    """``req_to_token[row, start:start+width]`` as the draft/verify kernels copy it."""
    cols = clamp_index(torch.as_tensor(start, dtype=I64) + torch.arange(width), r2t.shape[1])
    return r2t[int(row), cols]


def windows(ctx: Ctx, batch: Batch, width: int) -> list[tuple[int, int]]:
    """Per request, positions ``[lo, hi)`` a read or write of ``width`` from seq_len may touch."""
    if batch.exact_lens:
        return [(n, n + width) for n in batch.host_lens]
    return [(n, n + ctx.N + width) for n in batch.host_lens]


def ctx_hi(ctx: Ctx, batch: Batch) -> list[int]:
    """Per request, the end of the context positions attention may read."""
    return [n if batch.exact_lens else n + ctx.N for n in batch.host_lens]


def _ctx_reads(ctx: Ctx, batch: Batch, his: list[int]) -> list:
    """Attention's reads: req_to_token[row, :L], the KV in those slots, the SWA window."""
    rows = batch.rows
    reads: list = [(ctx.req_to_token, rows_cols(rows, [(0, h) for h in his], ctx.C))]
    slots = [s for r, h in zip(batch.reqs, his, strict=True) for s in r.slots_at(0, h)]
    reads.append((ctx.kv_cache, slots))
    if ctx.swa_map is not None:
        w = ctx.swa_window
        ws = [s for r, h in zip(batch.reqs, his, strict=True) for s in r.slots_at(max(0, h - w), h)]
        reads.append((ctx.swa_map, ws))
    return reads


def _write_slots(reqs: list[Req], wins: list[tuple[int, int]]) -> list[int]:
    return [s for r, (lo, hi) in zip(reqs, wins, strict=True) for s in r.slots_at(lo, hi)]


def _overlay(
    old: torch.Tensor, wins: list[tuple[int, int]], writes: list[dict[int, int]]
) -> torch.Tensor:
    """The declared KV write: old content, with the positions the kernel wrote replaced."""
    out = old.clone()
    off = 0
    for (lo, hi), w in zip(wins, writes, strict=True):
        for p, v in w.items():
            if lo <= p < hi:
                out[off + p - lo] = v
        off += hi - lo
    return out


def prefill_forward(ctx: Ctx, batch: Batch, ids: Buffer) -> dict[str, Buffer]:
    """Target prefill of each request's chunk ``[start, end)``: KV writes and the next token."""
    dev, F, m = ctx.dev, ctx.F, batch.m
    starts, ends, rows = batch.chunk_starts, batch.chunk_ends, batch.rows
    nxt = ctx.tmp(batch, "next_token_ids", (m,), I64, F)
    nsl = ctx.tmp(batch, "new_seq_lens", (m,), I64, F)
    wins = list(zip(starts, ends, strict=True))
    wslots = _write_slots(batch.reqs, wins)
    reads = [ids, *_ctx_reads(ctx, batch, ends), (ctx.kv_cache, wslots)]
    swa, w = ctx.swa_map is not None, ctx.swa_window

    def fn(ids_v, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        kv2 = kv.clone()
        out_t, off, writes = [], 0, []
        for i in range(m):
            s, e = starts[i], ends[i]
            toks = ids_v[off:off + e - s]
            off += e - s
            slots = clamp_index(_take(r2t, rows[i], s, e - s), kv.shape[0])
            vals = synth.kv_value(toks, torch.arange(s, e), slots)
            kv2[slots] = vals
            writes.append({s + j: int(vals[j]) for j in range(e - s)})
            c = synth.context_hash(r2t, kv2, rows[i], e, swa_v, w)
            out_t.append(int(synth.next_token(toks[-1], e, c)))
        kvw = _overlay(kv[torch.as_tensor(wslots, dtype=I64)], wins, writes)
        return kvw, torch.tensor(out_t, dtype=I64), torch.tensor(ends, dtype=I64)

    dev.launch(F, "prefill_forward", fn, reads=reads,
               writes=[(ctx.kv_cache, wslots), nxt, nsl],
               cost_us=ctx.draft_us + ctx.verify_us, observe="prefill_forward")
    return {"next_tokens": nxt, "new_seq_lens": nsl}


def draft_prefill(ctx: Ctx, batch: Batch, res: dict[str, Buffer]) -> dict[str, Buffer]:
    """The draft model's prefill: first top-k and hidden states (real probabilities)."""
    return _extend(ctx, batch, res, "draft_prefill", ones=False)


def _extend(
    ctx: Ctx, batch: Batch, res: dict[str, Buffer], name: str, ones: bool
) -> dict[str, Buffer]:
    dev, F, m, k, h = ctx.dev, ctx.F, batch.m, ctx.k, ctx.cfg.hidden_size
    tp = ctx.tmp(batch, "next_topk_p", (m, k), torch.float32, F)
    ti = ctx.tmp(batch, "next_topk_index", (m, k), I64, F)
    writes = [tp, ti]
    hid = None
    if ctx.cfg.hidden_states:
        hid = ctx.tmp(batch, "next_hidden", (m, h), torch.float32, F)
        writes.append(hid)

    def fn(tok, lens):
        ps, ids, hs = [], [], []
        for i in range(m):
            p, x = synth.next_topk(tok[i], lens[i], k, ones and k == 1)
            ps.append(p)
            ids.append(x)
            hs.append(synth.next_hidden(tok[i], lens[i], h))
        out = [torch.stack(ps) if m else torch.zeros(0, k),
               torch.stack(ids) if m else torch.zeros(0, k)]
        if hid is not None:
            out.append(torch.stack(hs) if m else torch.zeros(0, h))
        return tuple(out)

    dev.launch(F, name, fn, reads=[res["next_tokens"], res["new_seq_lens"]], writes=writes,
               cost_us=ctx.extend_us)
    out = dict(res)
    out.update(next_topk_p=tp, next_topk_index=ti)
    if hid is not None:
        out["next_hidden"] = hid
    return out


def spec_draft_verify(ctx: Ctx, batch: Batch, x: dict[str, Buffer | None],
                      plan: Buffer | None) -> dict[str, Buffer]:
    """Draft (out_cache_loc from req_to_token, multi-step draft, tree) and verify on F."""
    dev, F, m, N, ts = ctx.dev, ctx.F, batch.m, ctx.N, ctx.ts
    rows, sl = batch.rows, batch.seq_lens
    assert sl is not None
    docl = ctx.tmp(batch, "draft_out_cache_loc", (m, ts), I64, F)
    dev.launch(F, "draft_out_cache_loc",
               lambda s, r2t: torch.stack([_take(r2t, rows[i], s[i], ts) for i in range(m)]),
               reads=[sl, (ctx.req_to_token, rows_cols(rows, windows(ctx, batch, ts), ctx.C))],
               writes=[docl], cost_us=ctx.k_us, observe="draft_out_cache_loc")
    drafts = ctx.tmp(batch, "draft_tokens", (m, N - 1), I64, F)
    has_h = x.get("hidden") is not None
    steps = ctx.cfg.num_steps

    def draft(bonus, tp, ti, s, ocl, *hs):
        sc, tk, par = synth.draft_steps(bonus, tp, ti, hs[0] if hs else None, s, ocl, steps)
        return ctx.organizer.draft_tokens(sc, tk, par)

    dreads = [x["bonus"], x["topk_p"], x["topk_index"], sl, docl]
    dreads += [x["hidden"]] if has_h else []
    dev.launch(F, "draft", draft, reads=dreads, writes=[drafts], cost_us=ctx.draft_us)
    vocl = ctx.tmp(batch, "out_cache_loc", (m, N), I64, F)
    dev.launch(F, "verify_out_cache_loc",
               lambda s, r2t: torch.stack([_take(r2t, rows[i], s[i], N) for i in range(m)]),
               reads=[sl, (ctx.req_to_token, rows_cols(rows, windows(ctx, batch, N), ctx.C))],
               writes=[vocl], cost_us=ctx.k_us, observe="verify_out_cache_loc")
    return _verify(ctx, batch, x["bonus"], drafts, vocl, plan)


def _verify(ctx: Ctx, batch: Batch, bonus, drafts, vocl, plan) -> dict[str, Buffer]:
    dev, F, m, N = ctx.dev, ctx.F, batch.m, ctx.N
    rows, sl = batch.rows, batch.seq_lens
    names = ("next_tokens", "accept_lens", "new_seq_lens")
    res = {n: ctx.tmp(batch, n, (m,), I64, F) for n in names}
    out_tok = ctx.tmp(batch, "out_tokens", (m, N), I64, F)
    wins = windows(ctx, batch, N)
    wslots = _write_slots(batch.reqs, wins)
    reads = [bonus, drafts, sl, vocl, *_ctx_reads(ctx, batch, ctx_hi(ctx, batch)),
             (ctx.kv_cache, wslots)]
    if plan is not None:
        reads.append(plan)
    swa, w = ctx.swa_map is not None, ctx.swa_window

    def fn(b, d, s, ocl, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        kv_old = rest[1] if swa else rest[0]
        pl = rest[-1] if plan is not None else None
        nt, acc, nsl, outs, writes = [], [], [], [], []
        for i in range(m):
            n0 = int(s[i])
            c = synth.context_hash(r2t, kv, rows[i], n0, swa_v, w)
            if pl is not None:
                c = synth.mix(c, pl[i])
            inp = torch.cat([b[i:i + 1], d[i]])
            a = synth.accept_len(inp, n0, c, N)
            nb = int(synth.next_token(inp[a - 1], n0 + a, c))
            vals = synth.kv_value(inp, torch.arange(n0, n0 + N), ocl[i])
            writes.append({n0 + j: int(vals[j]) for j in range(N)})
            row = [int(t) for t in d[i, :a - 1]] + [nb] + [-1] * (N - a)
            nt.append(nb)
            acc.append(a)
            nsl.append(n0 + a)
            outs.append(row)
        kvw = _overlay(kv_old[torch.as_tensor(wslots, dtype=I64)], wins, writes)
        t = torch.tensor
        return (kvw, t(nt, dtype=I64), t(acc, dtype=I64), t(nsl, dtype=I64),
                t(outs, dtype=I64).reshape(m, N))

    dev.launch(F, "verify", fn, reads=reads,
               writes=[(ctx.kv_cache, wslots), res["next_tokens"], res["accept_lens"],
                       res["new_seq_lens"], out_tok],
               cost_us=ctx.verify_us, observe="verify")
    res["out_tokens"] = out_tok
    return res


def draft_extend(ctx: Ctx, batch: Batch, res: dict[str, Buffer]) -> dict[str, Buffer]:
    """draft_extend_for_decode on F: next top-k and hidden states from verify's outputs."""
    return _extend(ctx, batch, res, "draft_extend", ones=True)


def decode_forward(ctx: Ctx, batch: Batch, ids: Buffer, delayed: bool) -> dict[str, Buffer]:
    """Non-spec decode: one token per request at position L (slot req_to_token[row, L]).

    With delayed sampling it writes logits only; sampling happens later (step 7).
    """
    dev, F, m, rows = ctx.dev, ctx.F, batch.m, batch.rows
    sl = batch.seq_lens
    assert sl is not None
    out = ctx.tmp(batch, "logits" if delayed else "next_token_ids", (m,), I64, F)
    nsl = ctx.tmp(batch, "new_seq_lens", (m,), I64, F)
    wins = [(n, n + 1) for n in batch.host_lens]
    wslots = _write_slots(batch.reqs, wins)
    his = [n + 1 for n in batch.host_lens]
    swa, w = ctx.swa_map is not None, ctx.swa_window

    def fn(tok, s, r2t, kv, *rest):
        swa_v = rest[0] if swa else None
        kv2, nt, writes = kv.clone(), [], []
        for i in range(m):
            n0 = int(s[i])
            slot = clamp_index(_take(r2t, rows[i], n0, 1), kv.shape[0])
            v = synth.kv_value(tok[i:i + 1], n0, slot)
            kv2[slot] = v
            writes.append({n0: int(v[0])})
            c = synth.context_hash(r2t, kv2, rows[i], n0 + 1, swa_v, w)
            nt.append(int(synth.next_token(tok[i], n0 + 1, c)))
        kvw = _overlay(kv[torch.as_tensor(wslots, dtype=I64)], wins, writes)
        return kvw, torch.tensor(nt, dtype=I64), s + 1

    reads = [ids, sl, *_ctx_reads(ctx, batch, his)]
    dev.launch(F, "decode_forward", fn, reads=reads,
               writes=[(ctx.kv_cache, wslots), out, nsl],
               cost_us=ctx.draft_us + ctx.verify_us + ctx.extend_us, observe="decode_forward")
    return {"logits" if delayed else "next_tokens": out, "new_seq_lens": nsl}
