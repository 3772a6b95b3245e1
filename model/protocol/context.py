"""The run context: streams, the long-lived device buffers, the cost model, the pin ring.

One :class:`RunContext` per protocol run. It creates the streams of PROTOCOL.md §1 (the
schedule stream S, the forward stream F, and the D2H stream D or the plan stream PL where the
variant has them), allocates the scheduler's buffers of §3 (``req_to_token``, the KV cache, the
SWA mapping; the FutureMap owns its own relay buffers, see ``future_map.py``), and holds the
batch pin ring whose depth is ``protocol.pin_ring_depth``. Field names say what they hold, as
SGLang's do (``schedule_stream``, ``pool_size``); the glossary of PROTOCOL.md (S, F, D, PL)
appears only in prose.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from overlap_harness.model.config import (
    Mode,
    Platform,
    ProtocolConfig,
    SeqLensD2H,
    SeqLensSync,
    Timing,
)
from overlap_harness.model.device import Buffer, Device, Stream, SyncLabel
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol.kernels import DraftOrganizer, check_gather_impl
from overlap_harness.model.protocol.outcome import ProtocolOutcome
from overlap_harness.model.protocol.state import Batch

#: the batch tensors SGLang 0.5.23's result queue keeps through ``batch.copy()`` (its
#: ``req_pool_indices``, which the non-spec FutureMap gathers with) until the result is processed
RESULT_QUEUE_HELD = frozenset({"future_indices"})


class StreamAliasError(HarnessError):
    """The schedule and forward streams are one stream (#31681): every race would vanish."""


class RunContext:
    """Streams, buffers, sizes and costs of one run; see the module docstring.

    Args:
        device: the device the protocol runs on (simulated, serial oracle or CUDA).
        config: the protocol variant.
        timing: the cost model (microseconds).

    Raises:
        StreamAliasError: ``config.alias_schedule_forward`` (S and F one stream, #31681).
        HarnessError: a gather implementation ``device`` cannot run.
    """

    def __init__(self, device: Device, config: ProtocolConfig, timing: Timing) -> None:
        self.device, self.config, self.timing = device, config, timing
        self.is_spec = config.mode == Mode.SPEC_V2
        self.on_cuda = config.platform == Platform.CUDA
        # before #25879 the schedule stream waited on verify_done instead of publish_ready
        self.legacy_verify_done = (self.is_spec
                                   and config.seq_lens_sync == SeqLensSync.VERIFY_DONE)
        self.schedule_stream = device.stream("schedule")
        self.forward_stream = device.stream(
            "schedule" if config.alias_schedule_forward else "forward")
        if self.schedule_stream.name == self.forward_stream.name:
            raise StreamAliasError(
                f"the schedule stream S must differ from the forward stream F (#31681): both are "
                f"{self.schedule_stream.name!r}, so every S/F race would vanish; set "
                "protocol.alias_schedule_forward = false"
            )
        if self.is_spec:
            check_gather_impl(config.gather.value, device.torch_device)
        check_v0523_keys(config, self.is_spec, self.on_cuda)
        # SGLang makes fwd_prepare_d2h_stream on every CUDA FutureMap (overlap_utils.py:327-
        # 331); here only where something copies on it, so older scenarios keep their streams
        d2h_users = (config.seq_lens_d2h == SeqLensD2H.D2H_STREAM or config.mixed_spec_tails
                     or config.confidence_relay or config.spec_mixed_batches)
        has_d2h_stream = (self.is_spec and self.on_cuda and not self.legacy_verify_done
                          and d2h_users)
        self.d2h_stream: Stream | None = (
            device.stream("fwd_prepare_d2h") if has_d2h_stream else None)
        has_plan_stream = config.plan_stream or config.plan_stream_joins
        self.plan_stream: Stream | None = device.stream("plan") if has_plan_stream else None
        # SGLang 0.5.23's draft worker makes a plan stream of its own, apart from the target
        # worker's (get_plan_stream at eagle_worker_v2.py 241 and 1363, a new Stream each)
        self.draft_plan_stream: Stream | None = (
            device.stream("draft_plan") if config.plan_stream_joins else None)
        self.copy_stream: Stream | None = device.stream("copy") if config.copy_stream else None
        # sizes
        self.pool_size = config.pool_size  # request-pool rows, row 0 the padding row
        self.max_context = config.max_context  # columns of req_to_token
        self.kv_slots = self.pool_size * self.max_context
        self.num_draft_tokens = config.num_draft_tokens if self.is_spec else 1
        self.topk = config.topk
        self.draft_kv_width = config.topk * config.num_steps  # draft KV slots per request
        self.alloc_len = max(self.draft_kv_width, self.num_draft_tokens)
        self.swa_window = config.swa_window if config.swa else 0
        # costs (microseconds)
        self.kernel_us = timing.schedule_kernel
        fwd, share = timing.forward, timing.verify_share
        self.draft_us = fwd * share * 0.25  # draft, then verify: verify ends at verify_share
        self.verify_us = fwd * share * 0.75
        self.extend_us = fwd * (1 - share)
        self.d2h_us = timing.d2h
        # the scheduler's long-lived buffers (§3)
        i64 = torch.int64
        self.req_to_token = device.buffer(
            "req_to_token", (self.pool_size, self.max_context), i64, fill=0)
        self.kv_cache = device.buffer("kv_cache", (self.kv_slots,), i64, fill=0)
        self.swa_map: Buffer | None = (
            device.buffer("full_to_swa_index_mapping", (self.kv_slots,), i64, fill=0)
            if config.swa else None)
        self.organizer = DraftOrganizer(config.topk, config.num_steps, self.num_draft_tokens,
                                        self.pool_size, device.torch_device)
        self.outcome = ProtocolOutcome()
        self._pin_ring: deque[Batch] = deque()

    def tmp(self, batch: Batch, name: str, shape: Sequence[int], dtype: torch.dtype,
            stream: Stream) -> Buffer:
        """A batch-local device tensor allocated on ``stream``, kept alive by the pin ring."""
        buf = self.device.buffer(name, shape, dtype, stream=stream)
        batch.pinned.append(buf)
        return buf

    def pin(self, batch: Batch) -> None:
        """Step 4d: pin the batch's snapshot tensors for ``pin_ring_depth`` iterations.

        With the ``batch_pin_ring`` label removed (or depth 0) they are freed at once: the
        host drops its last reference while F may still read them. With
        ``result_queue_hold`` the future indices stay until the batch's result is processed
        (:meth:`processed`): SGLang 0.5.23's result queue holds ``batch.copy()``, which keeps
        ``req_pool_indices`` (schedule_batch.py 3992-4022, scheduler.py 2112).
        """
        keep = self.device.sync_enabled(SyncLabel.BATCH_PIN_RING)
        self._pin_ring.append(batch)
        depth = self.config.pin_ring_depth if keep else 0
        while len(self._pin_ring) > depth:
            old = self._pin_ring.popleft()
            for buf in old.pinned:
                if buf.freed:
                    continue
                if (self.config.result_queue_hold and not old.processed
                        and buf.name in RESULT_QUEUE_HELD):
                    old.held.append(buf)
                else:
                    self.device.free(buf)

    def processed(self, batch: Batch) -> None:
        """The batch's result was processed: the result queue drops its copy of the batch,
        and with it the last reference to what :meth:`pin` left held."""
        batch.processed = True
        for buf in batch.held:
            if not buf.freed:
                self.device.free(buf)
        batch.held.clear()


def check_v0523_keys(config: ProtocolConfig, is_spec: bool, on_cuda: bool) -> None:
    """Refuse a SGLang 0.5.23 key in a configuration where SGLang never takes that path.

    Raises:
        HarnessError: one line naming the key and what it needs.
    """
    needs = []
    if config.stream_ordered_resolve and not (
            is_spec and not on_cuda and config.seq_lens_d2h == SeqLensD2H.NONE):
        needs.append("protocol.stream_ordered_resolve needs mode = \"spec_v2\", platform = "
                     "\"hip\" and seq_lens_d2h = \"none\" (SGLang's gpu_only_lens, "
                     "scheduler.py:4661-4676)")
    if config.confidence_relay and not (is_spec and on_cuda):
        needs.append("protocol.confidence_relay needs mode = \"spec_v2\" on platform = "
                     "\"cuda\" (the ring is CUDA-only; the non-CUDA .cpu() read is not modelled)")
    if config.plan_stream_joins and config.plan_stream:
        needs.append("protocol.plan_stream_joins replaces plan_stream's once-per-batch plan: "
                     "set plan_stream = false")
    if config.verify_graph_load and not config.plan_stream_joins:
        needs.append("protocol.verify_graph_load stages the verify graph on the plan stream "
                     "of plan_stream_joins: set plan_stream_joins = true (without a plan "
                     "stream the load runs on F, ordered with the forward)")
    if config.spec_mixed_batches and config.mixed_spec_tails:
        needs.append("protocol.spec_mixed_batches late-binds the tails of mixed batches only: "
                     "set mixed_spec_tails = false")
    for key in ("mixed_spec_tails", "adopted_relay", "consume_once", "plan_stream_joins",
                "spec_mixed_batches"):
        if getattr(config, key) and not is_spec:
            needs.append(f"protocol.{key} needs mode = \"spec_v2\"")
    if needs:
        raise HarnessError("; ".join(needs))
