"""The written/landed masks belong to a block's current owner: an op of an earlier owner that
starts or ends after the block was handed to a new buffer neither checks nor marks them. Before
this, a race-free program whose op outlived its buffer's free was told it read "before any
write landed", and an old owner's late landing hid a new owner's real early read. Each case
has its twin in which the warning is due."""

from __future__ import annotations

import numpy as np
import torch

from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64


def read_after_free(sync: bool, reuse: bool) -> tuple[list[str], list[str]]:
    """``x`` on stream s reads buffer a (filled by the host); a is freed (after a sync of s
    when ``sync``) and, when ``reuse``, its block goes at once to buffer b, which nothing
    touches. Returns (uninitialised-read messages, race kinds)."""
    dev = SimDevice()
    s = dev.stream("s")
    a = dev.buffer("a", (4,), I64, fill=0)
    dev.launch(s, "x", lambda v: None, reads=[a], cost_us=10)
    if sync:
        dev.synchronize(s)
    dev.free(a)
    if reuse:
        dev.buffer("b", (4,), I64)
    run = dev.finish()
    return run.uninit_reads, [str(r.kind) for r in run.races]


def test_an_op_outliving_its_buffer_does_not_read_the_new_owners_masks() -> None:
    for sync in (False, True):
        assert read_after_free(sync, reuse=True) == ([], [])
        assert read_after_free(sync, reuse=False) == ([], [])


def early_read(old_write_lands_first: bool, written_by_new_owner: bool) -> list[str]:
    """Buffer a's write ``w`` (stream s, 50 us) is in flight when a is freed and its block
    goes to b; b's write ``wb`` (stream s3, 1000 us) is issued, and after 100 us of host work
    ``r`` on stream s2 reads b, long before ``wb`` lands. When ``old_write_lands_first``, w
    lands before r starts (on the same elements). Without ``written_by_new_owner``, wb is
    left out (r reads elements b's owner never wrote). Returns the uninitialised-read
    messages of ``r``."""
    dev = SimDevice()
    s, s2, s3 = dev.stream("s"), dev.stream("s2"), dev.stream("s3")
    a = dev.buffer("a", (4,), I64, fill=0)
    dev.launch(s, "w", lambda: torch.ones(4, dtype=I64), writes=[(a, np.arange(4))],
               cost_us=50 if old_write_lands_first else 5000)
    dev.free(a)
    b = dev.buffer("b", (4,), I64)
    if written_by_new_owner:
        dev.launch(s3, "wb", lambda: torch.full((4,), 2, dtype=I64),
                   writes=[(b, np.arange(4))], cost_us=1000)
    dev.host_work("spin", 100)
    dev.launch(s2, "r", lambda v: None, reads=[(b, np.arange(4))], cost_us=1)
    return [m for m in dev.finish().uninit_reads if m.startswith("r@")]


def test_an_old_owners_late_landing_does_not_hide_a_new_owners_early_read() -> None:
    expected = ["r@-1 reads elements of b before any write of them landed"]
    assert early_read(old_write_lands_first=True, written_by_new_owner=True) == expected
    # the twin without the old owner's landing in between: the same warning
    assert early_read(old_write_lands_first=False, written_by_new_owner=True) == expected


def test_a_new_owner_reading_what_it_never_wrote_is_still_told() -> None:
    assert early_read(old_write_lands_first=True, written_by_new_owner=False) == [
        "r@-1 reads never-written elements of b"]


def old_owner_reads_early(fenced: bool) -> tuple[list[str], list[str]]:
    """Stream s1 writes buffer a (1000 us); stream s2 reads a behind 50 us of other work,
    after an event wait on the write when ``fenced``. a is freed and its block handed to b
    right after the read is issued, so the read starts after the hand-over, before (unfenced)
    the write lands. Returns (uninitialised-read messages, race kinds)."""
    dev = SimDevice()
    s1, s2 = dev.stream("s1"), dev.stream("s2")
    a = dev.buffer("a", (4,), I64)
    dev.launch(s1, "w", lambda: torch.ones(4, dtype=I64), writes=[(a, np.arange(4))],
               cost_us=1000)
    if fenced:
        done = dev.event("done")
        dev.record(done, s1)
        dev.wait_event(s2, done)
    dev.launch(s2, "busy", lambda: None, cost_us=50)
    dev.launch(s2, "x", lambda v: None, reads=[(a, np.arange(4))], cost_us=1)
    dev.free(a)
    dev.buffer("b", (4,), I64)
    run = dev.finish()
    return run.uninit_reads, sorted({str(r.kind) for r in run.races})


def test_an_old_owners_read_before_its_own_write_landed_is_still_told() -> None:
    assert old_owner_reads_early(fenced=False) == (
        ["x@-1 reads elements of a before any write of them landed"], ["RAW"])
    assert old_owner_reads_early(fenced=True) == ([], [])


def test_the_masks_kept_for_old_owners_are_dropped_once_their_ops_are_done() -> None:
    dev = SimDevice()
    s = dev.stream("s")
    for round_no in range(300):  # half of each buffer written, so its mask is kept
        buf = dev.buffer(f"buf{round_no}", (64,), I64)
        dev.launch(s, "w", lambda: torch.ones(32, dtype=I64), writes=[(buf, np.arange(32))],
                   cost_us=5)
        dev.free(buf)
        if round_no % 10 == 9:
            dev.synchronize(s)
            dev.host_read(dev.buffer("pin", (1,), I64, pinned=True, fill=0))
    assert len(dev._retired_landed) <= 11
    assert not dev.finish().uninit_reads
