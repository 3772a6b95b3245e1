"""The run context: streams, the long-lived device buffers, the cost model, the pin ring.

One :class:`Ctx` per protocol run. It creates the streams of PROTOCOL.md §1 (S, F, and D, PL
or a side stream where the variant has them), allocates the buffers of §3 (``req_to_token``,
the KV cache, the SWA mapping, the FutureMap relay buffers and the pinned seq_lens mirror),
and holds the batch pin ring whose depth is ``protocol.pin_ring_depth``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from model.config import (
    FutureLayout,
    Mode,
    Platform,
    ProtocolConfig,
    SeqLensD2H,
    SeqLensSync,
    StashStream,
    Timing,
    WarBarrier,
)
from model.device import Buffer, Device, Stream, SyncLabel
from model.errors import HarnessError
from model.protocol.kernels import DraftOrganizer, check_gather_impl
from model.protocol.outcome import ProtocolOutcome
from model.protocol.state import Batch


class StreamAliasError(HarnessError):
    """The schedule and forward streams are one stream (#31681): every race would vanish."""


class Ctx:
    """Streams, buffers and costs of one run; see the module docstring."""

    def __init__(self, dev: Device, cfg: ProtocolConfig, timing: Timing) -> None:
        self.dev, self.cfg, self.t = dev, cfg, timing
        self.spec = cfg.mode == Mode.SPEC_V2
        self.cuda = cfg.platform == Platform.CUDA
        self.legacy = self.spec and cfg.seq_lens_sync == SeqLensSync.VERIFY_DONE
        self.S = dev.stream("schedule")
        self.F = dev.stream("schedule" if cfg.alias_schedule_forward else "forward")
        if self.S.name == self.F.name:
            raise StreamAliasError(
                f"the schedule stream S must differ from the forward stream F (#31681): both are "
                f"{self.S.name!r}, so every S/F race would vanish; set "
                "protocol.alias_schedule_forward = false"
            )
        if self.spec:
            check_gather_impl(cfg.gather.value, dev.torch_device)
        self.use_d2h = (self.spec and self.cuda and not self.legacy
                        and cfg.seq_lens_d2h == SeqLensD2H.D2H_STREAM)
        self.D: Stream | None = dev.stream("fwd_prepare_d2h") if self.use_d2h else None
        self.PL: Stream | None = dev.stream("plan") if cfg.plan_stream else None
        self.side: Stream | None = (dev.stream("stash_side")
                                    if cfg.stash_stream == StashStream.SIDE else None)
        self.barrier = (cfg.war_barrier if (self.cuda or cfg.force_barrier)
                        else WarBarrier.NONE)
        # sizes
        self.P = cfg.pool_size
        self.C = cfg.max_context
        self.NS = self.P * self.C
        self.ring = cfg.future_layout == FutureLayout.RING
        self.FP = cfg.ring_size if self.ring else self.P
        self.N = cfg.num_draft_tokens if self.spec else 1
        self.k = cfg.topk
        self.ts = cfg.topk * cfg.num_steps
        self.alloc_len = max(self.ts, self.N)
        self.swa_window = cfg.swa_window if cfg.swa else 0
        # costs
        self.k_us = timing.schedule_kernel
        fwd, vs = timing.forward, timing.verify_share
        self.draft_us = fwd * vs * 0.25  # draft, then verify: verify ends at verify_share
        self.verify_us = fwd * vs * 0.75
        self.extend_us = fwd * (1 - vs)
        self.d2h_us = timing.d2h
        # long-lived buffers (§3)
        i64 = torch.int64
        self.req_to_token = dev.buffer("req_to_token", (self.P, self.C), i64, fill=0)
        self.kv_cache = dev.buffer("kv_cache", (self.NS,), i64, fill=0)
        self.swa_map: Buffer | None = (
            dev.buffer("full_to_swa_index_mapping", (self.NS,), i64, fill=0) if cfg.swa else None)
        self.output_tokens_buf = dev.buffer(
            "output_tokens_buf", (self.FP,), i64, fill=-1 if cfg.debug_poison else None)
        self.new_seq_lens_buf = dev.buffer(  # -1 poison from #30471 on
            "new_seq_lens_buf", (self.FP,), i64, fill=-1 if cfg.debug_poison else None)
        self.seq_lens_mirror: Buffer | None = (
            dev.buffer("new_seq_lens_cpu_pinned", (self.FP,), i64, pinned=True)
            if self.use_d2h else None)
        self.topk_p_buf: Buffer | None = None  # lazy, first non-empty stash (§7 bootstrap)
        self.topk_index_buf: Buffer | None = None
        self.hidden_buf: Buffer | None = None
        # events
        self.publish_ready = dev.event("publish_ready")
        self.publish_recorded = False
        self.verify_done = dev.event("verify_done")
        self.verify_done_recorded = False
        self.read_done = None  # the one-shot event of war_barrier = read_done
        self.stash_done = dev.event("stash_done")  # stash_stream = side: F waits it (stash.fifo)
        self.stash_recorded = False
        # state
        self.organizer = DraftOrganizer(cfg.topk, cfg.num_steps, self.N, self.P,
                                        dev.torch_device)
        self.outcome = ProtocolOutcome()
        self.ring_counter = 0
        self.ring_owner: dict[int, str] = {}
        self._pin_ring: deque[list[Buffer]] = deque()
        self.pending_stash = None  # delayed_stash_after_gather: the deferred stash

    # -- helpers --------------------------------------------------------------------------
    def tmp(self, batch: Batch, name: str, shape: Sequence[int], dtype: torch.dtype,
            stream: Stream) -> Buffer:
        """A batch-local device tensor allocated on ``stream``, kept alive by the pin ring."""
        buf = self.dev.buffer(name, shape, dtype, stream=stream)
        batch.pinned.append(buf)
        return buf

    def ensure_spec_bufs(self, stream: Stream) -> None:
        """Allocate the top-k and hidden relay buffers on first use (``torch.empty``)."""
        if self.topk_p_buf is not None:
            return
        dev = self.dev
        self.topk_p_buf = dev.buffer("topk_p_buf", (self.FP, self.k), torch.float32, stream=stream)
        self.topk_index_buf = dev.buffer("topk_index_buf", (self.FP, self.k), torch.int64,
                                         stream=stream)
        if self.cfg.hidden_states:
            self.hidden_buf = dev.buffer("hidden_states_buf", (self.FP, self.cfg.hidden_size),
                                         torch.float32, stream=stream)

    def pin(self, batch: Batch) -> None:
        """Step 4d: pin the batch's snapshot tensors for ``pin_ring_depth`` iterations.

        With the ``batch_pin_ring`` label removed (or depth 0) they are freed at once: the
        host drops its last reference while F may still read them.
        """
        keep = self.dev.sync_enabled(SyncLabel.BATCH_PIN_RING)
        self._pin_ring.append(batch.pinned)
        depth = self.cfg.pin_ring_depth if keep else 0
        while len(self._pin_ring) > depth:
            for buf in self._pin_ring.popleft():
                if not buf.freed:
                    self.dev.free(buf)
