"""``context_hashes`` keeps its values with bounded memory (issue 17).

The reference below is the broadcast the function used before: an (m, C, W) mask of "write j
targets this position's slot and request i sees it", its last true index per position. The
new lookup (binary search over the writes sorted by slot and order) must give the same
hashes on every input the workers produce (owners non-decreasing), and its peak memory must
not grow with m x C x W.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_harness.model.protocol import synth

MOD = synth.MOD
ROOT = Path(__file__).resolve().parents[2]


def reference_hashes(r2t, kv, rows, lengths, swa_mapping, swa_window, writes):
    """The pre-issue-17 formula, written out with the full (m, C, W) mask."""
    n_rows, cols = r2t.shape
    m = len(rows)
    rows_t = torch.tensor(rows, dtype=torch.int64).clamp(0, max(n_rows - 1, 0))
    length = lengths.to(torch.int64).reshape(-1).clamp(0, cols)
    col = torch.arange(cols, dtype=torch.int64)
    slots = r2t[rows_t].clamp(0, kv.shape[0] - 1)
    vals = kv[slots]
    if writes is not None and writes[0].numel():
        ws, wv, wo = writes
        seen = (slots[:, :, None] == ws[None, None, :]) & (
            wo[None, None, :] <= torch.arange(m)[:, None, None])
        order = torch.arange(ws.numel(), dtype=torch.int64)
        last = torch.where(seen, order, torch.full_like(order, -1)).amax(dim=-1)
        vals = torch.where(last >= 0, wv.to(torch.int64)[last.clamp(min=0)], vals)
    inside = col[None, :] < length[:, None]
    h = torch.remainder((torch.remainder(vals * (col + 1), MOD) * inside).sum(dim=1), MOD)
    if swa_mapping is not None and swa_window > 0:
        start = (length - swa_window).clamp(min=0)
        j = col[None, :] - start[:, None]
        window = inside & (j >= 0)
        s2 = torch.remainder((swa_mapping[slots] * (j + 3) * window).sum(dim=1), MOD)
        h = torch.where(length > 0, synth.mix(h, s2), h)
    return h


@st.composite
def hash_inputs(draw):
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    n_rows, cols, n_slots = draw(st.integers(1, 6)), draw(st.integers(1, 12)), draw(
        st.integers(1, 20))
    m = draw(st.integers(1, 6))
    r2t = torch.randint(-2, n_slots + 2, (n_rows, cols), generator=gen)  # garbage is clamped
    kv = torch.randint(0, MOD, (n_slots,), generator=gen)
    rows = [draw(st.integers(-1, n_rows)) for _ in range(m)]
    lengths = torch.randint(0, cols + 2, (m,), generator=gen)
    swa = torch.randint(0, 50, (n_slots,), generator=gen) if draw(st.booleans()) else None
    window = draw(st.integers(0, 5))
    writes = None
    if draw(st.booleans()):
        count = draw(st.integers(0, 30))
        owners = torch.sort(torch.randint(0, m + 1, (count,), generator=gen)).values
        writes = (torch.randint(0, n_slots, (count,), generator=gen),
                  torch.randint(0, MOD, (count,), generator=gen), owners)
    return r2t, kv, rows, lengths, swa, window, writes


@settings(derandomize=True, deadline=None, max_examples=300)
@given(hash_inputs())
def test_context_hashes_equal_the_broadcast_reference(args):
    assert torch.equal(synth.context_hashes(*args), reference_hashes(*args))


def test_later_write_to_a_slot_wins_and_later_requests_are_unseen():
    # slots 0..3 hold 10..13; request 0 reads slots [1, 2], request 1 reads [2, 3].
    r2t = torch.tensor([[1, 2], [2, 3]])
    kv = torch.tensor([10, 11, 12, 13])
    writes = (torch.tensor([2, 2, 3]), torch.tensor([100, 200, 300]), torch.tensor([0, 1, 1]))
    got = synth.context_hashes(r2t, kv, [0, 1], torch.tensor([2, 2]), writes=writes)
    # request 0 sees only the first write (slot 2 = 100); request 1 sees all (slot 2 = 200,
    # slot 3 = 300): hash = sum of value * (position + 1) mod MOD
    assert got.tolist() == [(11 * 1 + 100 * 2) % MOD, (200 * 1 + 300 * 2) % MOD]


LARGE_PREFILL = """
import resource, torch
from overlap_harness.model.protocol import synth
m, cols = 256, 512
r2t = torch.arange(m * cols, dtype=torch.int64).reshape(m, cols)
kv = torch.zeros(m * cols, dtype=torch.int64)
count = m * 64
writes = (torch.arange(count) * 7 % (m * cols), torch.ones(count, dtype=torch.int64),
          torch.arange(count) // 64)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = synth.context_hashes(r2t, kv, list(range(m)), torch.full((m,), cols), writes=writes)
assert out.shape == (m,)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024)
"""


def test_memory_is_bounded_at_a_large_prefill():
    # 256 requests of context 512, each writing 64 positions: the old (m, C, W) mask alone
    # was 256 * 512 * 16,384 bools = 2.1 GB; the lookup needs a few (m, C) int64 arrays.
    proc = subprocess.run([sys.executable, "-c", LARGE_PREFILL], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=120)
    growth_mb = int(proc.stdout.strip())
    assert growth_mb < 200, f"peak RSS grew by {growth_mb} MB"
