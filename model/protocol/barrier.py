"""WAR-barrier placements: where the schedule stream S is fenced behind the forward stream F.

S writes shared buffers for batch n (``req_to_token``, the SWA mapping) while forward n-1 may
still read them (PROTOCOL.md §2, "The WAR hazard"). SGLang has placed the fence in several
points of the loop over its history; each placement here is one class, and each point of the
loop where a barrier may go is one method of :class:`BarrierPlacement`, called by the loop at
that point (the scheduler and the batch runner):

- :meth:`~BarrierPlacement.at_loop_top`: iteration start, before ``get_next_batch`` (#26380);
- :meth:`~BarrierPlacement.after_metadata_reads`: on F, once the forward has copied its
  metadata out of ``req_to_token`` (the ``out_cache_loc`` copies that stand for a CUDA-graph
  runner's ``replay_prepare``), before verify;
- :meth:`~BarrierPlacement.after_forward_reads`: on F, after the last read of S-written
  buffers (spec-v2: after verify, before draft-extend; non-spec: after the decode forward),
  where #28363's runner records its one-shot ``read_done`` event;
- :meth:`~BarrierPlacement.before_draft_extend`: on F, before spec-v2's draft-extend (the
  last phase that reads S-written buffers, run by the draft runner);
- :meth:`~BarrierPlacement.after_launch`: right after ``run_batch`` returns (#31687).

The base class does nothing at every point. A new placement is one subclass plus its entry in
:data:`PLACEMENTS` and a ``protocol.war_barrier`` choice (model/config.py). On a platform other
than CUDA there is no barrier (#26646) unless ``protocol.force_barrier`` (#27967) applies the
configured one (:func:`placement_for`). Every barrier wait carries the ``war_barrier`` label.
"""

from __future__ import annotations

from overlap_harness.model.config import DecodeReadDone, ProtocolConfig, WarBarrier
from overlap_harness.model.device import Device, Event, Stream, SyncLabel


class BarrierPlacement:
    """No WAR barrier: every point of the loop is a no-op (``war_barrier = "none"``)."""

    def at_loop_top(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """Iteration start, before S schedules batch n."""

    def after_metadata_reads(self, device: Device, forward: Stream) -> None:
        """On F, after the forward's metadata copies from ``req_to_token`` (spec-v2)."""

    def after_forward_reads(self, device: Device, forward: Stream) -> None:
        """On F, after the forward's last read of S-written buffers."""

    def before_draft_extend(self, device: Device, forward: Stream) -> None:
        """On F, before spec-v2's draft-extend starts."""

    def after_launch(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """Right after ``run_batch`` has launched batch n."""


class LoopTop(BarrierPlacement):
    """#26380: at the top of the loop, S waits on all of F (``wait_stream``)."""

    def at_loop_top(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """S waits on everything F has queued: all of forward n-1."""
        device.wait_stream(schedule, forward, SyncLabel.WAR_BARRIER)


class ReadDone(LoopTop):
    """#28363: S waits on the runner's one-shot ``read_done`` event, recorded on F after the
    forward's last read of S-written buffers; all of F when none was recorded since."""

    def __init__(self) -> None:
        self.read_done: Event | None = None

    def at_loop_top(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """S waits on ``read_done`` if recorded (and consumes it), else on all of F."""
        if self.read_done is not None:
            device.wait_event(schedule, self.read_done, SyncLabel.WAR_BARRIER)
            self.read_done = None
        else:
            super().at_loop_top(device, schedule, forward)

    def after_forward_reads(self, device: Device, forward: Stream) -> None:
        """Record a fresh ``read_done`` on F."""
        self._record(device, forward)

    def _record(self, device: Device, forward: Stream) -> None:
        self.read_done = device.event("read_done")
        device.record(self.read_done, forward)


class AfterLaunch(BarrierPlacement):
    """#31687: S waits on all of F right after each ``run_batch`` launch, so result
    processing of n-1 (which writes on S) is ordered after forward n too."""

    def after_launch(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """S waits on everything F has queued: all of forward n."""
        device.wait_stream(schedule, forward, SyncLabel.WAR_BARRIER)


class AfterReplayPrepare(ReadDone):
    """The one-shot event recorded earlier than #28363's: right after the forward's metadata
    reads of ``req_to_token`` (a graph runner's ``replay_prepare``), before verify. S then
    waits only for those copies, not for verify. In this model verify's attention still
    translates its context through ``req_to_token``, so S's writes can race it. Non-spec has
    no separate metadata step here: S waits on all of F, as at the loop top."""

    def after_metadata_reads(self, device: Device, forward: Stream) -> None:
        """Record a fresh ``read_done`` on F, after the ``out_cache_loc`` copies."""
        self._record(device, forward)

    def after_forward_reads(self, device: Device, forward: Stream) -> None:
        """Nothing: the event was recorded at the metadata reads."""


class AfterLaunchReadDone(BarrierPlacement):
    """SGLang 0.5.23's ``_apply_war_barrier`` (scheduler.py 2012-2023), called right after
    each ``run_batch`` launch (2108-2111): S waits the read-done event that the step's last
    shared-reading runner published, and clears it; with none published, S waits on all of F.

    Who publishes (facts of 0.5.23): the decode graph runner, after its metadata reads
    (``_publish_read_done``, decode_cuda_graph_runner.py 689-697), so a non-spec decode
    records it after the forward's reads here (:meth:`after_forward_reads`). EAGLE's last
    shared reader is the draft runner (eagle_worker_v2.py 1366-1372), whose draft-extend graph
    runner clears any earlier event (eagle_draft_extend_cuda_graph_runner.py 664-666) and,
    with the default backend's ``UNKNOWN`` read end, publishes none (:meth:`before_draft_extend`):
    spec-v2 gets the coarse fence. Prefill and mixed (extend) batches publish none either
    (base_attn_backend.py 195-233: ``UNKNOWN`` for extend), so they get the coarse fence too.
    Forward reads that come after the event (publish and stash reading ``future_indices``) are
    not covered by it: their tensors' lifetime rests on the keep-alive ring. Each branch has
    its own label as well (``war_barrier.read_done_wait``, ``war_barrier.fallback_wait``), so
    one of SGLang's two lines can be removed alone."""

    def __init__(self, record: DecodeReadDone = DecodeReadDone.AFTER_READS) -> None:
        self.read_done: Event | None = None
        self.record = record  # how the decode runner records it (``decode_read_done``)

    def after_forward_reads(self, device: Device, forward: Stream) -> None:
        """The runner publishes a read-done event recorded on F: one recorded after the reads
        (``after_reads``), or as SGLang's decode CUDA graph records it: inside the replay
        (``in_graph``), or after it (``post_replay``, the in-graph one still recorded, unused),
        or before it after the out-of-graph reads (``pre_replay``, the same).
        A record removed leaves the event unrecorded: waiting on it orders nothing."""
        self.read_done = device.event("read_done")  # shared_read_done_event
        if self.record is DecodeReadDone.AFTER_READS:
            device.record(self.read_done, forward)
            return
        in_graph = self.read_done if self.record is DecodeReadDone.IN_GRAPH else device.event(
            "in_graph_metadata_prep_done")
        device.record(in_graph, forward, SyncLabel.READ_DONE_RECORD_IN_GRAPH)
        if self.record in (DecodeReadDone.POST_REPLAY, DecodeReadDone.PRE_REPLAY):
            # one SGLang line (_publish_read_done(in_graph=False)) records it for both: after
            # the replay, or before it once the out-of-graph metadata reads are done
            device.record(self.read_done, forward, SyncLabel.READ_DONE_RECORD_POST_REPLAY)

    def before_draft_extend(self, device: Device, forward: Stream) -> None:
        """The draft-extend runner discards any earlier event and publishes none."""
        self.read_done = None

    def after_launch(self, device: Device, schedule: Stream, forward: Stream) -> None:
        """S waits the published event (consumed), else everything F has queued."""
        event, self.read_done = self.read_done, None
        if event is not None:
            if device.sync_enabled(SyncLabel.WAR_BARRIER_READ_DONE_WAIT):
                device.wait_event(schedule, event, SyncLabel.WAR_BARRIER)
        elif device.sync_enabled(SyncLabel.WAR_BARRIER_FALLBACK_WAIT):
            device.wait_stream(schedule, forward, SyncLabel.WAR_BARRIER)


PLACEMENTS: dict[WarBarrier, type[BarrierPlacement]] = {
    WarBarrier.NONE: BarrierPlacement,
    WarBarrier.LOOP_TOP: LoopTop,
    WarBarrier.READ_DONE: ReadDone,
    WarBarrier.AFTER_LAUNCH: AfterLaunch,
    WarBarrier.AFTER_REPLAY_PREPARE: AfterReplayPrepare,
    WarBarrier.AFTER_LAUNCH_READ_DONE: AfterLaunchReadDone,
}


def placement_for(config: ProtocolConfig) -> BarrierPlacement:
    """The run's placement: ``config.war_barrier`` on CUDA or when forced; else none."""
    applies = config.platform.value == "cuda" or config.force_barrier
    placement = PLACEMENTS[config.war_barrier if applies else WarBarrier.NONE]
    if placement is AfterLaunchReadDone:
        return AfterLaunchReadDone(config.decode_read_done)
    return placement()
