"""The FutureMap relay (PROTOCOL.md §3): indices, seq_lens resolve, gather, publish, stash.

A batch's results travel to the next iteration through P-row device buffers indexed by the
request-pool row (REF) or by slots of the old ring (#13713): ``publish`` scatters the new
seq_lens on F and records ``publish_ready``; ``stash`` scatters the bonus token, top-k and
hidden states on F; the next iteration gathers them back, seq_lens on S (and its CPU mirror on
D, or by a blocking ``.cpu()`` on S), the rest on F. Every sync carries its SyncLabel.
"""

from __future__ import annotations

import torch

from model.device import Buffer, SyncLabel
from model.protocol.context import Ctx
from model.protocol.kernels import gather_spec_extras
from model.protocol.outcome import DebugFailure
from model.protocol.state import Batch
from model.protocol.synth import clamp_index, take_rows

L = SyncLabel
I64 = torch.int64


def build_indices(ctx: Ctx, batch: Batch, op: str) -> None:
    """On S: the batch's ``future_indices`` (and, in the ring layout, its output slots).

    Merge and filter build a fresh index tensor from the host's lists (cat / index with keep
    indices arriving by non-blocking H2D); F reads it later, so its lifetime is fenced by
    ``record_stream(F)`` and the pin ring.
    """
    if ctx.ring:
        out = []
        for r in batch.reqs:
            s = ctx.ring_counter % ctx.FP
            ctx.ring_counter += 1
            ctx.ring_owner[s] = r.id
            out.append(s)
        batch.slots_in = [r.fslot for r in batch.reqs]
        batch.slots_out = out
        for r, s in zip(batch.reqs, out, strict=True):
            r.fslot = s
    else:
        batch.slots_in = batch.slots_out = batch.rows
    m = batch.m
    batch.fi = ctx.tmp(batch, "future_indices", (m,), I64, ctx.S)
    vals = torch.tensor(batch.slots_in, dtype=I64)
    ctx.dev.launch(ctx.S, op, lambda: vals, writes=[batch.fi], cost_us=ctx.k_us)
    if ctx.ring:
        batch.fo = ctx.tmp(batch, "future_indices_out", (m,), I64, ctx.S)
        outv = torch.tensor(batch.slots_out, dtype=I64)
        ctx.dev.launch(ctx.S, op + "_out", lambda: outv, writes=[batch.fo], cost_us=ctx.k_us)
    else:
        batch.fo = batch.fi


def _cpu_on_schedule(ctx: Ctx, batch: Batch) -> list[int]:
    """The blocking ``.cpu()`` of the gathered seq_lens on S (bootstrap, HIP, or by choice)."""
    assert batch.seq_lens is not None
    pinned = ctx.dev.buffer("seq_lens_cpu", (batch.m,), I64, pinned=True)
    ctx.dev.copy(ctx.S, batch.seq_lens, pinned, non_blocking=False, cost_us=ctx.d2h_us,
                 label=L.SEQ_LENS_CPU_SYNC, name="seq_lens_cpu")
    return [int(v) for v in ctx.dev.host_read(pinned, None, name="read_seq_lens_cpu")]


def resolve_seq_lens_cpu(ctx: Ctx, batch: Batch) -> list[int] | None:
    """Step 4a: S gathers seq_lens from ``new_seq_lens_buf``; the host gets its CPU copy.

    CUDA: S waits ``publish_ready``; the CPU copy comes from D (D waits ``publish_ready``,
    copies the WHOLE buffer into the pinned mirror, the host syncs D and selects rows), or
    from a blocking ``.cpu()`` on S, or not at all (backend opted out). Before the first
    publish the event was never recorded and resolve uses ``.cpu()``. HIP: the host waits on
    ``publish_ready`` instead of a stream wait, and uses ``.cpu()``. Legacy verify_done: S
    already waited on verify_done in scheduling, so no publish_ready wait here.

    With ``debug_poison`` (#30471) the gathered values are asserted >= 0 on S and the rows
    are re-poisoned to -1 on S once the CPU copy is done, so a resolve without a fresh
    publish of its row reads -1 and result processing reports ``seq_lens_poison``.
    """
    dev = ctx.dev
    if not ctx.legacy and ctx.publish_recorded:
        if ctx.cuda:
            dev.wait_event(ctx.S, ctx.publish_ready, L.PUBLISH_READY_SCHEDULE_WAIT)
        else:
            dev.synchronize(ctx.publish_ready, L.PUBLISH_READY_HOST_WAIT)
    batch.seq_lens = ctx.tmp(batch, "seq_lens", (batch.m,), I64, ctx.S)
    rows = list(batch.slots_in)
    fp = ctx.FP
    dev.launch(ctx.S, "gather_seq_lens", lambda buf, fi: buf[clamp_index(fi, fp)],
               reads=[(ctx.new_seq_lens_buf, rows), batch.fi], writes=[batch.seq_lens],
               cost_us=ctx.k_us, observe="gather_seq_lens")
    if ctx.cfg.debug_poison:
        flags = ctx.tmp(batch, "seq_lens_flags", (batch.m,), I64, ctx.S)
        batch.flags["seq_lens_flags"] = flags
        dev.launch(ctx.S, "assert_seq_lens", lambda s: (s < 0).to(I64),
                   reads=[batch.seq_lens], writes=[flags], cost_us=ctx.k_us)
    cpu = _seq_lens_to_host(ctx, batch, rows)
    if ctx.cfg.debug_poison:
        m = len(rows)
        dev.launch(ctx.S, "repoison_seq_lens",
                   lambda fi: torch.full((m,), -1, dtype=I64, device=fi.device),
                   reads=[batch.fi], writes=[(ctx.new_seq_lens_buf, rows)], cost_us=ctx.k_us)
    return cpu


def _seq_lens_to_host(ctx: Ctx, batch: Batch, rows: list[int]) -> list[int] | None:
    """The CPU copy of the gathered seq_lens: from D, a blocking ``.cpu()`` on S, or none."""
    dev = ctx.dev
    if ctx.cfg.seq_lens_d2h.value == "none":
        return None
    if ctx.use_d2h and ctx.publish_recorded:
        assert ctx.D is not None and ctx.seq_lens_mirror is not None
        dev.wait_event(ctx.D, ctx.publish_ready, L.PUBLISH_READY_D2H_WAIT)
        dev.copy(ctx.D, ctx.new_seq_lens_buf, ctx.seq_lens_mirror, non_blocking=True,
                 cost_us=ctx.d2h_us, name="d2h_seq_lens")
        dev.synchronize(ctx.D, L.D2H_HOST_SYNC)
        vals = dev.host_read(ctx.seq_lens_mirror, rows, name="select_seq_lens")
        return [int(v) for v in vals]
    return _cpu_on_schedule(ctx, batch)


def gather_spec_inputs(ctx: Ctx, batch: Batch) -> dict[str, Buffer | None]:
    """Step 4c, spec-v2: ``fi.record_stream(F)``, then the spec-extras gather on F.

    ``fused``/``triton`` is one launch, ``unfused`` four (§4). With ``debug_poison`` the
    assert-and-invalidate launch follows (#26108).
    """
    dev, F, m = ctx.dev, ctx.F, batch.m
    assert batch.fi is not None
    dev.record_stream(batch.fi, F, L.FUTURE_INDICES_RECORD_STREAM)
    _after_stash(ctx)
    ctx.ensure_spec_bufs(F)
    assert ctx.topk_p_buf is not None and ctx.topk_index_buf is not None
    rows = list(batch.slots_in)
    k, h, fp = ctx.k, ctx.cfg.hidden_size, ctx.FP
    out: dict[str, Buffer | None] = {
        "topk_p": ctx.tmp(batch, "topk_p", (m, k), torch.float32, F),
        "topk_index": ctx.tmp(batch, "topk_index", (m, k), I64, F),
        "bonus": ctx.tmp(batch, "bonus_tokens", (m,), I64, F),
        "hidden": (ctx.tmp(batch, "hidden_states", (m, h), torch.float32, F)
                   if ctx.hidden_buf is not None else None),
    }
    srcs = [("topk_p", ctx.topk_p_buf), ("topk_index", ctx.topk_index_buf),
            ("bonus", ctx.output_tokens_buf), ("hidden", ctx.hidden_buf)]
    srcs = [(n, b) for n, b in srcs if b is not None]
    if ctx.cfg.gather.value == "unfused":
        for name, src in srcs:
            dst = out[name]
            dev.launch(F, f"gather_{name}", lambda buf, fi: buf[clamp_index(fi, fp)],
                       reads=[(src, rows), batch.fi], writes=[dst], cost_us=ctx.k_us,
                       observe="gather_spec_extras")
    else:
        impl = ctx.cfg.gather.value
        has_h = ctx.hidden_buf is not None

        def fused(fi, tp, ti, ot, *hs):
            res = gather_spec_extras(clamp_index(fi, fp), tp, ti, ot, hs[0] if hs else None, impl)
            return res if has_h else res[:3]

        reads = [batch.fi] + [(b, rows) for _, b in srcs]
        writes = [out[n] for n, _ in srcs]
        dev.launch(F, "gather_spec_extras", fused, reads=reads, writes=writes,
                   cost_us=ctx.k_us, observe="gather_spec_extras")
    bonus = out["bonus"]
    assert bonus is not None
    _poison(ctx, batch, bonus)
    return out


def gather_output_tokens(ctx: Ctx, batch: Batch, indices: Buffer | None = None) -> Buffer:
    """Step 4c, non-spec decode: gather ``output_tokens_buf[req_pool_indices]`` on F.

    A mixed batch passes its ``mix_running_indices`` as ``indices`` (their lifetime is the
    caller's keep-alive); otherwise the batch's ``future_indices``, with ``record_stream(F)``.
    """
    dev, F = ctx.dev, ctx.F
    if indices is None:
        assert batch.fi is not None
        indices = batch.fi
        dev.record_stream(indices, F, L.FUTURE_INDICES_RECORD_STREAM)
    _after_stash(ctx)
    ids = ctx.tmp(batch, "input_ids", (batch.m,), I64, F)
    fp = ctx.FP
    dev.launch(F, "gather_output_tokens", lambda buf, fi: buf[clamp_index(fi, fp)],
               reads=[(ctx.output_tokens_buf, list(batch.slots_in)), indices], writes=[ids],
               cost_us=ctx.k_us, observe="gather_output_tokens")
    _poison(ctx, batch, ids)
    return ids


def _poison(ctx: Ctx, batch: Batch, gathered: Buffer) -> None:
    """CI's async assert (values >= 0) and invalidate (``buf[indices] = -1``), on F.

    The assert does not crash the run: it sets a per-row flag that copy_to_cpu brings back and
    result processing turns into a ``poison_assert`` :class:`DebugFailure`.
    """
    if not ctx.cfg.debug_poison:
        return
    m = batch.m
    flags = ctx.tmp(batch, "assert_flags", (m,), I64, ctx.F)
    batch.flags["assert_flags"] = flags  # device side; copy_to_cpu brings it back

    def assert_invalidate(v):
        return torch.full((m,), -1, dtype=I64, device=v.device), (v < 0).to(I64)

    ctx.dev.launch(ctx.F, "assert_invalidate", assert_invalidate, reads=[gathered],
                   writes=[(ctx.output_tokens_buf, list(batch.slots_in)), flags],
                   cost_us=ctx.k_us, observe="assert_gathered")


def publish(ctx: Ctx, batch: Batch, new_seq_lens: Buffer, stream=None) -> None:
    """``on_publish``: scatter the new seq_lens into ``new_seq_lens_buf``, record publish_ready.

    Returns early for an empty batch (DP idle): no scatter and no record. Rows named by a
    ``skip_publish`` event are left out (§9.21's mutation). Non-spec publishes too, unread and
    with no event. Legacy ``verify_done``: the scatter stands for S's seq_lens being rebound
    to the forward's output, and ``verify_done`` is recorded after it instead.
    """
    if batch.m == 0:
        return
    stream = stream or ctx.F
    keep = [i for i, r in enumerate(batch.reqs) if r.id not in batch.skip_publish]
    rows = [batch.slots_out[i] for i in keep]
    ctx.dev.launch(stream, "publish", lambda v, fo: take_rows(v, keep),
                   reads=[new_seq_lens, batch.fo], writes=[(ctx.new_seq_lens_buf, rows)],
                   cost_us=ctx.k_us)
    if ctx.legacy:  # before #25879: S's seq_lens are the forward's output, fenced by verify_done
        ctx.dev.record(ctx.verify_done, stream)
        ctx.verify_done_recorded = True
    elif ctx.spec:
        ctx.dev.record(ctx.publish_ready, stream)
        ctx.publish_recorded = True


def stash(ctx: Ctx, batch: Batch, tokens: Buffer, topk_p: Buffer | None = None,
          topk_index: Buffer | None = None, hidden: Buffer | None = None) -> None:
    """Scatter the bonus tokens (and top-k, hidden states) into their relay rows.

    On F (FIFO before the next gather), or, with ``stash_stream = side``, on the side stream
    after it waits on F, followed by a ``stash_done`` record that F waits on before its next
    gather (label ``stash.fifo``; removed, §9.1's bug). The side stream's reads are covered
    by ``record_stream`` so the pin ring may free them. Empty batches return early. Requests in
    ``batch.skip_stash`` are left out (§9.18's missing seed); those in ``batch.double_stash``
    are stashed a second time by a ``stash_replay`` launch (§9.17's WW).
    """
    if batch.m == 0:
        return
    stream = ctx.F
    if ctx.side is not None:
        ctx.dev.wait_stream(ctx.side, ctx.F)  # the data is ready
        stream = ctx.side
    srcs: list[tuple[Buffer, Buffer | None]] = [(tokens, ctx.output_tokens_buf)]
    if topk_p is not None and topk_index is not None:
        ctx.ensure_spec_bufs(stream)
        srcs += [(topk_p, ctx.topk_p_buf), (topk_index, ctx.topk_index_buf)]
        if hidden is not None and ctx.hidden_buf is not None:
            srcs.append((hidden, ctx.hidden_buf))
    keep = [i for i, r in enumerate(batch.reqs) if r.id not in batch.skip_stash]
    _scatter(ctx, stream, batch, "stash", keep, srcs)
    dup = [i for i in keep if batch.reqs[i].id in batch.double_stash]
    _scatter(ctx, stream, batch, "stash_replay", dup, srcs)
    if ctx.side is not None:
        for src in [s for s, _ in srcs] + [batch.fo]:
            if src is not None:
                ctx.dev.record_stream(src, ctx.side)
        ctx.dev.record(ctx.stash_done, ctx.side)
        ctx.stash_recorded = True


def _after_stash(ctx: Ctx) -> None:
    """Before a gather on F: wait for the side stream's last stash (``stash.fifo``)."""
    if ctx.side is not None and ctx.stash_recorded:
        ctx.dev.wait_event(ctx.F, ctx.stash_done, L.STASH_ORDER)


def _scatter(ctx: Ctx, stream, batch: Batch, name: str, pos: list[int],
             srcs: list[tuple[Buffer, Buffer | None]]) -> None:
    """One stash launch: rows ``pos`` of each source into the relay rows of those requests."""
    if not pos:
        return
    rows = [batch.slots_out[i] for i in pos]
    reads: list = [src for src, _ in srcs] + [batch.fo]
    writes: list = [(dst, rows) for _, dst in srcs]
    full = len(pos) == batch.m

    def fn(*v):
        vals = tuple(x if full else take_rows(x, pos) for x in v[:-1])
        return vals if len(vals) > 1 else vals[0]

    ctx.dev.launch(stream, name, fn, reads=reads, writes=writes, cost_us=ctx.k_us)


def copy_to_cpu(ctx: Ctx, batch: Batch, bufs: dict[str, Buffer]) -> None:
    """Non-blocking D2H of the results into pinned memory on F, then a NEW copy_done event."""
    dev = ctx.dev
    batch.copy_done = dev.event("copy_done")
    bufs = {**bufs, **batch.flags}
    batch.flags = {}
    for name, src in bufs.items():
        dst = dev.buffer(f"{name}_cpu", src.shape, src.dtype, pinned=True)
        dev.copy(ctx.F, src, dst, non_blocking=True, cost_us=ctx.d2h_us, name=f"d2h_{name}")
        batch.results[name] = dst
    dev.record(batch.copy_done, ctx.F)


def check_ring(ctx: Ctx, batch: Batch) -> None:
    """Ring layout only: a harness check that each gathered slot still belongs to its reader."""
    if not ctx.ring:
        return
    for r, s in zip(batch.reqs, batch.slots_in, strict=True):
        owner = ctx.ring_owner.get(s)
        if owner != r.id:
            ctx.outcome.debug_failures.append(DebugFailure(
                batch.iteration, r.id, "ring_alias",
                f"FutureMap ring slot {s} was reallocated to {owner!r} before {r.id!r} read it"))
