"""The synthetic model: integer-exact stand-ins for the target and draft forwards.

Every output is a deterministic integer function of the op's inputs (token ids, seq_lens,
slot ids read from ``req_to_token``, KV content read through those slots, SWA mapping
entries), so one stale or clobbered input gives a visibly different output, on the simulated
device and on a GPU alike. There is no learning and no floating-point reduction: the float
outputs (top-k probabilities, hidden states) are small integers divided by a power of ten, made
from integers the same way on every device.

All functions take and return CPU or device ``torch.int64`` tensors (floats where named) and
never raise on garbage input: indices are clamped, values reduced modulo :data:`MOD`, so a race
shows up as a wrong value, not a crash of the simulator.
"""

from __future__ import annotations

import torch

MOD = 1_000_003
"""All hashed values live in [0, MOD)."""
VOCAB = 997
"""Token ids live in [0, VOCAB); -1 is the debug poison."""


def mix(*xs: torch.Tensor | int) -> torch.Tensor:
    """A hash-like integer mix of its arguments (broadcast), in [0, MOD)."""
    h: torch.Tensor | int = 17
    for x in xs:
        x = torch.remainder(torch.as_tensor(x, dtype=torch.int64), MOD)
        h = torch.remainder(torch.as_tensor(h, dtype=torch.int64) * 7919 + x * 104729 + 12345, MOD)
    return torch.as_tensor(h, dtype=torch.int64)


def prompt_token(seed: int, pos: int) -> int:
    """Token ``pos`` of a request's prompt (host-side, from the request's seed)."""
    return int(mix(seed, pos, 11)) % VOCAB


def kv_value(tok: torch.Tensor, pos: torch.Tensor | int, slot: torch.Tensor) -> torch.Tensor:
    """The KV content a forward writes for token ``tok`` at position ``pos`` in ``slot``."""
    return mix(tok, pos, slot)


def take_rows(v: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Rows ``positions`` (host-known ints) of ``v``, gathered on ``v``'s device."""
    return v.index_select(0, torch.tensor(positions, dtype=torch.int64, device=v.device))


def clamp_index(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Garbage indices (a stale or never-written id) read the nearest valid element."""
    return idx.to(torch.int64).clamp(0, max(n - 1, 0))


def context_hash(
    req_to_token: torch.Tensor,
    kv_cache: torch.Tensor,
    row: int,
    length: int,
    swa_mapping: torch.Tensor | None = None,
    swa_window: int = 0,
) -> torch.Tensor:
    """Attention's summary of a request's context: its KV positions ``[0, length)``.

    Reads the slot ids ``req_to_token[row, :length]``, then the KV content in those slots,
    and (with SWA) the mapping entries of the last ``swa_window`` positions; a cleared mapping
    entry (0) or a wrong slot id changes the hash.
    """
    cols = req_to_token.shape[1]
    length = max(0, min(int(length), cols))
    r = min(max(int(row), 0), req_to_token.shape[0] - 1)
    slots = clamp_index(req_to_token[r, :length], kv_cache.shape[0])
    pos = torch.arange(length, dtype=torch.int64)
    h = torch.remainder(torch.remainder(kv_cache[slots] * (pos + 1), MOD).sum(), MOD)
    if swa_mapping is not None and swa_window > 0 and length:
        w = slots[max(0, length - swa_window):]
        mapped = swa_mapping[w]
        h = mix(h, torch.remainder((mapped * (torch.arange(w.numel()) + 3)).sum(), MOD))
    return h


def next_token(prev: torch.Tensor, pos: torch.Tensor | int, ctx: torch.Tensor) -> torch.Tensor:
    """The target model's next token after ``prev`` at position ``pos``, given the context."""
    return torch.remainder(mix(prev, pos, ctx, 1), VOCAB)


def draft_token(
    prev: torch.Tensor, pos: torch.Tensor | int, aux: torch.Tensor | int
) -> torch.Tensor:
    """One draft step: the draft model's guess after ``prev`` (``aux`` = top-k id, hidden)."""
    return torch.remainder(mix(prev, pos, aux, 7), VOCAB)


def accept_len(inputs: torch.Tensor, length: torch.Tensor | int, ctx: torch.Tensor, n: int) -> int:
    """How many of the ``n`` verified tokens are accepted, in 1..n (bonus included)."""
    w = torch.arange(1, inputs.numel() + 1, dtype=torch.int64)
    s = torch.remainder((torch.remainder(inputs, MOD) * w).sum(), MOD)
    return 1 + int(mix(s, length, ctx, 13)) % n


def next_topk(
    token: torch.Tensor, length: torch.Tensor | int, k: int, ones: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft top-k (probabilities float32, ids int64) after ``token`` at ``length``.

    ``ones``: after a decode on CUDA with topk=1 the probabilities are all ones (argmax
    replaces softmax); after a prefill they are real values.
    """
    j = torch.arange(k, dtype=torch.int64)
    ids = torch.remainder(mix(token, length, j, 3), VOCAB)
    if ones:
        return torch.ones(k, dtype=torch.float32), ids
    p = (torch.remainder(mix(token, length, j, 4), 997) + 1).to(torch.float32) / 1000.0
    return p, ids


def next_hidden(token: torch.Tensor, length: torch.Tensor | int, h: int) -> torch.Tensor:
    """Draft hidden state (float32, integer-valued) after ``token`` at ``length``."""
    j = torch.arange(h, dtype=torch.int64)
    return torch.remainder(mix(token, length, j, 5), 1000).to(torch.float32)


def hidden_key(hidden: torch.Tensor | None) -> torch.Tensor:
    """An integer summary of one hidden-state row for the draft (0 when not relayed)."""
    if hidden is None or hidden.numel() == 0:
        return torch.tensor(0, dtype=torch.int64)
    return torch.remainder(hidden.to(torch.int64).sum(), MOD)


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
    zeros = torch.zeros(b, dtype=torch.int64)
    hk = (torch.stack([hidden_key(None if hidden is None else hidden[i]) for i in range(b)])
          if b else zeros)
    slot_key = torch.remainder(ocl.to(torch.int64).sum(dim=1), MOD) if ocl.numel() else zeros
    aux = (hk + slot_key)[:, None]
    tok = draft_token(topk_index, seq_lens[:, None] + 1, aux + bonus[:, None])  # (b,k)
    scores = [topk_p.to(torch.float32)[:, None, :]]
    tokens = [tok]
    parents = [torch.arange(-1, k, dtype=torch.int64).repeat(b, 1)]
    prev_scores, prev_tok = topk_p.to(torch.float32), tok
    for i in range(1, num_steps):
        child = draft_token(prev_tok[:, :, None], seq_lens[:, None, None] + 1 + i,
                            aux[:, :, None] + torch.arange(k)[None, None, :])  # (b,k,k)
        pc = (torch.remainder(child, 97) + 1).to(torch.float32) / 100.0
        cum = prev_scores[:, :, None] * pc
        scores.append(cum)
        tokens.append(child.reshape(b, k * k))
        parents.append((torch.arange(k, dtype=torch.int64) + k * k * (i - 1) + k).repeat(b, 1))
        best = cum.reshape(b, k * k).topk(k, dim=1)
        prev_scores = best.values
        prev_tok = torch.gather(child.reshape(b, k * k), 1, best.indices)
    return scores, tokens, parents
