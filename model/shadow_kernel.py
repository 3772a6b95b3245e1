"""The detector's element-level checks as one compiled pass over a batch of accesses.

:class:`overlap_harness.model.detector.HBDetector` computes every node's vector clock as it is
fed, and queues the node's accesses. This module checks a batch of them at once, in issue
order, against the shadow memory (per element and agent: the op of the agent's latest write,
of its latest read, and the slot of its latest access of any mode), and reports every racing
pair at element level: a *hit* is (access, mode, prior op, element, latest?).

The rules are the detector's (its module docstring): an access races with agent X's latest
conflicting access of an element when that access's epoch is above what the new access's
clock knows of X; then X's older accesses of the element are walked back, newest first, while
they stay unordered, and those of the conflicting mode are hits too (``latest`` False). Each
access of each element is a *slot*; a slot links to the same agent's previous slot of the same
element (any mode), so the walk visits exactly the agent's accesses of that element, the
element-level form of the per-block access log that the per-access checks walk
(:mod:`overlap_harness.model.shadow_per_access`).

Compiled with numba (``cache=True``: the machine code is kept beside this file after the first
run). Why compiled: the checks are a few integer comparisons per element and agent, and the
benchmark's 4 million element accesses per 100,000 ops cost seconds as numpy calls per access
(docs/benchmarks.md). Nothing here holds Python objects; only the hits are collected into
a list that grows as they are found.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

# the modes of a hit: the prior access was a write (checked first), or a read
PRIOR_WRITE, PRIOR_READ = 0, 1


def _compiled(function: Callable) -> Callable:
    """``function`` compiled by numba, its machine code cached on disk; where numba finds
    no writable place for the cache (neither beside this file nor in the user's cache
    folder, it raises when asked to cache), compiled afresh in each process instead."""
    try:
        return njit(cache=True, nogil=True)(function)
    except RuntimeError:
        return njit(nogil=True)(function)


@_compiled
def _hit_array(hits):
    """The hits, a list of 5-tuples, as one (n, 5) int64 array."""
    out = np.empty((len(hits), 5), dtype=np.int64)
    for row in range(len(hits)):
        access, mode, prior, element, latest = hits[row]
        out[row, 0] = access
        out[row, 1] = mode
        out[row, 2] = prior
        out[row, 3] = element
        out[row, 4] = latest
    return out


@_compiled
def check_batch(acc_op, acc_agent, acc_base, acc_numel, acc_write, acc_lo, acc_hi, elements,
                acc_clock, n_agents, stride, epoch, last_op, last_slot,
                slot_op, slot_prev, slot_write, slot_count, max_scan):
    """Check and record the accesses of one batch, in order.

    Per access ``i``: op ``acc_op[i]`` on agent ``acc_agent[i]``, block elements
    ``elements[acc_lo[i]:acc_hi[i]]`` of a block whose shadow starts at element
    ``acc_base[i]`` and has ``acc_numel[i]`` elements, a write when ``acc_write[i]``, the op's
    vector clock ``acc_clock[i, :n_agents]``. ``epoch[op]`` is each op's epoch. The shadow
    arrays are element-major with ``stride`` entries (one per agent) per element and mode:
    ``last_op`` holds, per element, the ops of each agent's latest write, then of its latest
    read (-1: none); ``last_slot`` per element and agent a slot (-1: none). Slots
    ``[0, slot_count)`` are in use; the caller makes room for one per element of the batch.

    Returns (the hits, one row each: access, mode, prior op, element, latest (1) or older
    (0); the new slot count; the number of older walks cut at ``max_scan``; the index of the
    first access with an element outside its block, or -1)."""
    # a list, not arrays grown in place: a reassigned array in the loop made the whole pass
    # three times slower (docs/benchmarks.md)
    hits = [(0, 0, 0, 0, 0)]
    hits.pop()
    truncated = 0
    for i in range(acc_op.shape[0]):
        op = acc_op[i]
        agent = acc_agent[i]
        write = acc_write[i]
        base = acc_base[i]
        numel = acc_numel[i]
        for k in range(acc_lo[i], acc_hi[i]):
            element = elements[k]
            if element < 0 or element >= numel:
                return _hit_array(hits), slot_count, truncated, i
            cell = (base + element) * stride
            for mode in range(2):
                if mode == PRIOR_READ and not write:
                    break  # a read conflicts with prior writes only
                entries = 2 * cell + mode * stride
                for other in range(n_agents):
                    prior = last_op[entries + other]
                    if prior < 0:
                        continue
                    known = acc_clock[i, other]
                    if epoch[prior] <= known:
                        continue  # ordered before this access, and so is all before it
                    hits.append((i, mode, prior, element, 1))
                    # the agent's older accesses of this element, while still unordered
                    slot = last_slot[cell + other]
                    scanned = 0
                    while slot >= 0:
                        older = slot_op[slot]
                        if epoch[older] <= known:
                            break
                        if scanned == max_scan:
                            truncated += 1
                            break
                        if older != prior and slot_write[slot] == (mode == PRIOR_WRITE):
                            hits.append((i, mode, older, element, 0))
                        slot = slot_prev[slot]
                        scanned += 1
            # record this access: the latest of its mode, and a slot in the agent's chain
            last_op[2 * cell + (PRIOR_WRITE if write else PRIOR_READ) * stride + agent] = op
            slot_op[slot_count] = op
            slot_write[slot_count] = write
            slot_prev[slot_count] = last_slot[cell + agent]
            last_slot[cell + agent] = slot_count
            slot_count += 1
    return _hit_array(hits), slot_count, truncated, -1


@_compiled
def compact_slots(last_slot, slot_op, slot_prev, slot_write, slot_count, epoch, op_agent,
                  floor):
    """Drop the slots every agent's clock has passed (``epoch[op] <= floor[agent of op]``):
    they happen before every access still to come, so no walk reaches them (a walk stops at
    the first ordered slot). The live slots move down, keeping their order, and every link
    to a dropped slot becomes -1. Returns the new slot count."""
    new_index = np.empty(slot_count, dtype=np.int64)
    kept = 0
    for slot in range(slot_count):
        op = slot_op[slot]
        if epoch[op] > floor[op_agent[op]]:
            new_index[slot] = kept
            slot_op[kept] = op
            slot_write[kept] = slot_write[slot]
            previous = slot_prev[slot]
            slot_prev[kept] = -1 if previous < 0 else new_index[previous]
            kept += 1
        else:
            new_index[slot] = -1
    for cell in range(last_slot.shape[0]):
        slot = last_slot[cell]
        if slot >= 0:
            last_slot[cell] = new_index[slot]
    return kept
