"""The synthetic model: integer-exact stand-ins for the target and draft forwards.

Every output is a deterministic integer function of the op's inputs (token ids, seq_lens,
slot ids read from ``req_to_token``, KV content read through those slots, SWA mapping
entries), so one stale or clobbered input gives a visibly different output, on the simulated
device and on a GPU alike. There is no learning and no floating-point reduction: the float
outputs (top-k probabilities, hidden states) are small integers divided by a power of two, so
every float is exact and bit-identical on every device (a division by a power of ten is not:
CUDA divides by a scalar as a multiply by its rounded reciprocal, the CPU divides correctly
rounded, and the two differ in the last bit).

Host-known index lists reach the op's device through :func:`ints`, that is through the
device API's :func:`model.staging.host_ints`: a device that runs op functions at issue time
routes it through its own asynchronous staging; the protocol does not know which device.

All functions take and return CPU or device ``torch.int64`` tensors (floats where named) and
never raise on garbage input: indices are clamped, values reduced modulo :data:`MOD`, so a race
shows up as a wrong value, not a crash of the simulator.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from overlap_harness.model.staging import host_ints

MOD = 1_000_003
"""All hashed values live in [0, MOD)."""
VOCAB = 997
"""Token ids live in [0, VOCAB); -1 is the debug poison."""


def ints(values: Sequence[int] | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host-known ints as an int64 tensor on ``device``, through the device's staging
    (:func:`model.staging.host_ints`)."""
    return host_ints(values, device)


def mix(*xs: torch.Tensor | int) -> torch.Tensor:
    """A hash-like integer mix of its arguments (broadcast), in [0, MOD).

    Python ints stay host constants, so the result lives on the tensors' device (a CPU
    0-dim tensor when every argument is an int).

    The definition is a chain of steps ``h = (h * A + (x mod MOD) * B + C) mod MOD`` from
    ``h = 17`` (:data:`_STEP`). A chain of such affine steps is one affine map: after ``n``
    steps ``h = 17 A^n + sum_i A^(n-i) (B (x_i mod MOD) + C)`` mod MOD. So the ints and the
    constants fold into one host constant, and each tensor costs a reduction and one
    multiply-add with its own coefficient ``B A^(n-i) mod MOD``: two torch ops, where the
    chain took four (a torch op on these tiny tensors costs microseconds of dispatch,
    whatever its size). Every product is below MOD**2 and the sum of ``n`` of them below
    ``n`` MOD**2 + MOD, far under 2**63: exact int64 arithmetic, the same values.
    """
    n = len(xs)
    constant, coefficients = _affine(n)
    acc: torch.Tensor | None = None
    for x, coefficient in zip(xs, coefficients, strict=True):
        if not isinstance(x, torch.Tensor):
            constant += (x % MOD) * coefficient
            continue
        reduced = torch.remainder(x if x.dtype is torch.int64 else x.to(torch.int64), MOD)
        if acc is None:
            acc = reduced.mul_(coefficient)  # a fresh tensor: scaled in place
        else:  # out of place: ``reduced`` may broadcast ``acc`` to more dims
            acc = torch.add(acc, reduced, alpha=coefficient)
    if acc is None:
        return torch.tensor(constant % MOD, dtype=torch.int64)
    return torch.remainder(acc.add_(constant % MOD), MOD)


def mix_ints(*xs: int) -> int:
    """:func:`mix` of host ints, as a Python int (no tensor made)."""
    constant, coefficients = _affine(len(xs))
    return (constant + sum(x % MOD * c for x, c in zip(xs, coefficients, strict=True))) % MOD


#: One step of :func:`mix`: ``h = (h * A + (x mod MOD) * B + C) mod MOD``, as (A, B, C).
_STEP = (7919, 104729, 12345)


@functools.cache
def _affine(n: int) -> tuple[int, tuple[int, ...]]:
    """``n`` steps of :data:`_STEP` from ``h = 17`` as one affine map (mod MOD): its
    constant, and the coefficient of each argument's residue, first argument first."""
    a, b, c = _STEP
    constant = 17 * pow(a, n, MOD) + c * sum(pow(a, k, MOD) for k in range(n))
    return constant % MOD, tuple(b * pow(a, n - 1 - i, MOD) % MOD for i in range(n))


def prompt_token(seed: int, pos: int) -> int:
    """Token ``pos`` of a request's prompt (host-side, from the request's seed)."""
    return mix_ints(seed, pos, 11) % VOCAB


def kv_value(tok: torch.Tensor, pos: torch.Tensor | int, slot: torch.Tensor) -> torch.Tensor:
    """The KV content a forward writes for token ``tok`` at position ``pos`` in ``slot``."""
    return mix(tok, pos, slot)


def take_rows(v: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Rows ``positions`` (host-known ints) of ``v``, gathered on ``v``'s device."""
    return v.index_select(0, ints(positions, v.device))


def clamp_index(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Garbage indices (a stale or never-written id) read the nearest valid element."""
    return idx.to(torch.int64).clamp(0, max(n - 1, 0))


def take_cols(r2t: torch.Tensor, rows: list[int], start: torch.Tensor, width: int) -> torch.Tensor:
    """``req_to_token[row_i, start_i : start_i + width]`` per request, as (m, width).

    What the draft/verify kernels copy into ``out_cache_loc``; columns are clamped.
    """
    dev = r2t.device
    rows_t = ints(rows, dev).clamp(0, r2t.shape[0] - 1)
    cols = start.to(torch.int64).reshape(-1, 1) + torch.arange(width, device=dev)
    return r2t[rows_t[:, None], clamp_index(cols, r2t.shape[1])]


def _last_visible_write(
    slots: torch.Tensor, write_slots: torch.Tensor, write_owners: torch.Tensor
) -> torch.Tensor:
    """Per position of ``slots`` (m, C): the index of the last write to that slot that request
    i sees (owner <= i), or -1; owners must be non-decreasing in write order.

    Request i sees exactly the first ``bound[i]`` writes. Keys ``slot * (W + 1) + order``
    sorted once; the largest key below ``slot * (W + 1) + bound[i]`` is that slot's last
    visible write when its slot matches. All on the tensors' device, no host sync.
    """
    m = slots.shape[0]
    count = write_slots.numel()
    order = torch.arange(count, dtype=torch.int64, device=slots.device)
    ws = write_slots.to(torch.int64)
    bound = torch.searchsorted(write_owners.to(torch.int64).contiguous(),
                               torch.arange(m, dtype=torch.int64, device=slots.device),
                               right=True)  # (m,)
    keys, _ = torch.sort(ws * (count + 1) + order)
    query = slots * (count + 1) + bound[:, None]  # (m, C)
    at = torch.searchsorted(keys, query.reshape(-1)).reshape(query.shape) - 1
    hit = keys[at.clamp(min=0)]
    same_slot = (at >= 0) & (torch.div(hit, count + 1, rounding_mode="floor") == slots)
    return torch.where(same_slot, torch.remainder(hit, count + 1), torch.full_like(at, -1))


def context_hashes(
    req_to_token: torch.Tensor,
    kv_cache: torch.Tensor,
    rows: list[int],
    lengths: torch.Tensor,
    swa_mapping: torch.Tensor | None = None,
    swa_window: int = 0,
    writes: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention's summary of each request's context: its KV positions ``[0, length)``, (m,).

    Reads the slot ids ``req_to_token[row, :length]``, then the KV content in those slots,
    and (with SWA) the mapping entries of the last ``swa_window`` positions; a cleared mapping
    entry (0) or a wrong slot id changes the hash. ``writes`` = (slots, values, owner) are the
    forward's own KV writes, in request order (``owner`` never decreases, as each forward
    issues them): request i sees those of requests 0..i (the last write to a slot wins), as if
    the requests ran one after another.

    Memory is O(m x C + W) for W writes: each context position looks up the last write to its
    slot among the first ``bound[i]`` writes by binary search over the writes sorted by
    (slot, order). The broadcast it replaces built an (m, C, W) mask, 2.7 GB at batch 512
    (issue 17); the values are the same (tests/model/test_context_hashes.py checks both).
    """
    dev = req_to_token.device
    n_rows, cols = req_to_token.shape
    rows_t = ints(rows, dev).clamp(0, max(n_rows - 1, 0))
    length = lengths.to(torch.int64).reshape(-1).clamp(0, cols)
    col = torch.arange(cols, dtype=torch.int64, device=dev)
    slots = clamp_index(req_to_token[rows_t], kv_cache.shape[0])  # (m, C)
    vals = kv_cache[slots]
    if writes is not None and writes[0].numel():
        last = _last_visible_write(slots, writes[0], writes[2])
        vals = torch.where(last >= 0, writes[1].to(torch.int64)[last.clamp(min=0)], vals)
    inside = col[None, :] < length[:, None]
    h = torch.remainder((torch.remainder(vals * (col + 1), MOD) * inside).sum(dim=1), MOD)
    if swa_mapping is not None and swa_window > 0:
        start = (length - swa_window).clamp(min=0)
        j = col[None, :] - start[:, None]
        window = inside & (j >= 0)
        s2 = torch.remainder((swa_mapping[slots] * (j + 3) * window).sum(dim=1), MOD)
        h = torch.where(length > 0, mix(h, s2), h)
    return h


def overlay(old: torch.Tensor, positions: list[int], owners: list[int], start: torch.Tensor,
            vals: torch.Tensor) -> torch.Tensor:
    """A declared KV write: ``old`` content, with the positions the kernel wrote replaced.

    ``positions``/``owners`` (host ints) name each declared element's position and request;
    the kernel wrote ``vals[i, j]`` at position ``start[i] + j`` of request i.
    """
    dev = old.device
    pos = ints(positions, dev)
    own = ints(owners, dev)
    width = vals.shape[1]
    j = pos - start.to(torch.int64)[own]
    hit = (j >= 0) & (j < width)
    return torch.where(hit, vals[own, j.clamp(0, max(width - 1, 0))].to(old.dtype), old)


def next_token(prev: torch.Tensor, pos: torch.Tensor | int, ctx: torch.Tensor) -> torch.Tensor:
    """The target model's next token after ``prev`` at position ``pos``, given the context."""
    return torch.remainder(mix(prev, pos, ctx, 1), VOCAB)


def draft_token(
    prev: torch.Tensor, pos: torch.Tensor | int, aux: torch.Tensor | int
) -> torch.Tensor:
    """One draft step: the draft model's guess after ``prev`` (``aux`` = top-k id, hidden)."""
    return torch.remainder(mix(prev, pos, aux, 7), VOCAB)


def accept_len(inputs: torch.Tensor, length: torch.Tensor, ctx: torch.Tensor, n: int
               ) -> torch.Tensor:
    """How many of the ``n`` verified tokens (rows of ``inputs``, (m, n)) are accepted, per
    request in 1..n (bonus included)."""
    w = torch.arange(1, inputs.shape[1] + 1, dtype=torch.int64, device=inputs.device)
    s = torch.remainder((torch.remainder(inputs, MOD) * w).sum(dim=1), MOD)
    return 1 + torch.remainder(mix(s, length, ctx, 13), n)


def next_topk(
    token: torch.Tensor, length: torch.Tensor, k: int, ones: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft top-k (probabilities float32, ids int64), (m, k), after ``token`` at ``length``.

    ``ones``: after a decode on CUDA with topk=1 the probabilities are all ones (argmax
    replaces softmax); after a prefill they are real values, integers in 1..997 divided by
    1024 in float32 (exact, so the same bits on every device).
    """
    j = torch.arange(k, dtype=torch.int64, device=token.device)[None, :]
    t, n = token.reshape(-1, 1), length.reshape(-1, 1)
    ids = torch.remainder(mix(t, n, j, 3), VOCAB)
    if ones:
        return torch.ones(ids.shape, dtype=torch.float32, device=token.device), ids
    p = (torch.remainder(mix(t, n, j, 4), 997) + 1).to(torch.float32) / 1024.0
    return p, ids


def next_hidden(token: torch.Tensor, length: torch.Tensor, h: int) -> torch.Tensor:
    """Draft hidden states (float32, integer-valued), (m, h), after ``token`` at ``length``."""
    j = torch.arange(h, dtype=torch.int64, device=token.device)[None, :]
    return torch.remainder(mix(token.reshape(-1, 1), length.reshape(-1, 1), j, 5),
                           1000).to(torch.float32)


def hidden_keys(hidden: torch.Tensor | None, b: int, device: torch.device) -> torch.Tensor:
    """An integer summary of each hidden-state row for the draft (0 when not relayed), (b,)."""
    if hidden is None or hidden.numel() == 0:
        return torch.zeros(b, dtype=torch.int64, device=device)
    return torch.remainder(hidden.to(torch.int64).sum(dim=1), MOD)


def draft_steps(
    bonus: torch.Tensor,
    topk_p: torch.Tensor,
    topk_index: torch.Tensor,
    hidden: torch.Tensor | None,
    seq_lens: torch.Tensor,
    ocl: torch.Tensor,
    num_steps: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The multi-step draft for b requests: per-step scores, tokens and parents (PROTOCOL §5).

    Shapes follow the slow path's inputs: step 0 scores (b,1,k), tokens (b,k), parents
    (b,k+1); step i>0 scores (b,k,k) cumulative, tokens (b,k*k), parents (b,k). The draft's KV
    slots (``ocl``, from ``req_to_token``) feed the tokens, so a wrong slot id shows.
    """
    b, k = topk_index.shape
    dev = topk_index.device
    ar = torch.arange(k, dtype=torch.int64, device=dev)
    hk = hidden_keys(hidden, b, dev)
    slot_key = torch.remainder(ocl.to(torch.int64).sum(dim=1), MOD)
    aux = (hk + slot_key)[:, None]
    tok = draft_token(topk_index, seq_lens[:, None] + 1, aux + bonus[:, None])  # (b,k)
    first = topk_p.to(torch.float32)
    scores = [first[:, None, :]]
    tokens = [tok]
    parents = [torch.arange(-1, k, dtype=torch.int64, device=dev).repeat(b, 1)]
    prev_scores, prev_tok = first, tok
    lens, child_aux = seq_lens[:, None, None], aux[:, :, None] + ar  # the same every step
    for i in range(1, num_steps):
        # (lens + 1) + i as lens + (1 + i): int64 addition wraps, so it associates
        child = draft_token(prev_tok[:, :, None], lens + (1 + i), child_aux)  # (b,k,k)
        pc = torch.remainder(child, 97).add_(1).to(torch.float32).div_(128.0)  # exact: 2**-7
        cum = prev_scores[:, :, None] * pc
        scores.append(cum)
        flat = child.reshape(b, k * k)
        tokens.append(flat)
        parents.append((ar + (k * k * (i - 1) + k)).repeat(b, 1))
        if k == 1:  # the top 1 of one score is that score, its token that token
            prev_scores, prev_tok = cum.reshape(b, 1), flat
            continue
        best = cum.reshape(b, k * k).topk(k, dim=1)
        prev_scores = best.values
        prev_tok = torch.gather(flat, 1, best.indices)
    return scores, tokens, parents
