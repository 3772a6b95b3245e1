"""Drive SGLang's real FutureMap in the order the 0.5.23 overlap event loop calls it.

``Scheduler.run_batch`` cannot be driven here: ``sglang.srt.managers.scheduler`` imports
huggingface_hub, transformers and the model runner (docs/sglang-conformance.md). So this is a
hand-written replay of the loop, each step citing the scheduler.py line it stands for, and
every FutureMap call is SGLang's own code (``FutureMap``, ``RelayPayload``,
``resolve_forward_inputs``, ``gather_spec_extras``). The model forward is a stand-in kernel
that reads the rows the real forward reads (input ids, ``req_to_token``) and writes the
sampled tokens and new lengths.

One iteration (scheduler.py ``event_loop_overlap`` 2061-2130, ``run_batch`` 4660-4760):

1. schedule stream: allocate the batch's ``req_pool_indices`` and write its KV slots into
   ``req_to_token`` (the shared buffer the WAR barrier protects);
2. ``future_map.resolve_seq_lens_cpu(batch)`` on the schedule stream (4667);
3. forward stream: ``wait_stream(schedule_stream)`` (4672), ``resolve_forward_inputs`` (4681),
   the forward, ``publish`` (spec: mid-worker via ``on_publish``, 4692; non-spec: after, 4708),
   ``stash`` through ``_relay_forward_payload`` (4971), the result copy on copy_stream (5018);
4. ``_apply_war_barrier``: schedule stream ``wait_stream(forward_stream)`` (2023);
5. process the previous batch: ``copy_done.synchronize()`` and read its tokens on the host.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.conformance import sglang_env
from overlap_harness.model.trace import Race

POOL_SIZE = 8
MAX_CONTEXT = 64
TOPK = 2
HIDDEN = 4


class Mutation(StrEnum):
    """Changes to the real code (or to the loop it runs in), each expected to race."""

    FORWARD_NO_WAIT = "forward_no_wait_schedule"  # run_batch 4672 wait_stream dropped
    WAR_BARRIER = "war_barrier_removed"  # _apply_war_barrier is a no-op
    PUBLISH_READY_WAIT = "publish_ready_wait_dropped"  # resolve_seq_lens_cpu's waits dropped
    PINNED_EARLY = "pinned_mirror_read_early"  # fwd_prepare_d2h_stream.synchronize() dropped
    NO_RECORD_STREAM = "relay_index_freed_without_record_stream"  # no keep-alive, no record
    KEEP_ALIVE_RING = "keep_alive_ring_dropped"  # record_batch_in_overlap's ring only
    RECORD_STREAM = "record_stream_dropped"  # SGLang's own record_stream calls only


RING_DROPPED = {Mutation.NO_RECORD_STREAM, Mutation.KEEP_ALIVE_RING}
RECORD_STREAM_DROPPED = {Mutation.NO_RECORD_STREAM, Mutation.RECORD_STREAM}


@dataclass(frozen=True, slots=True)
class Step:
    """One scheduler iteration: rows prefilled, rows decoding, rows decoded as a mixed tail."""

    prefill: tuple[int, ...] = ()
    decode: tuple[int, ...] = ()
    mixed: bool = False  # prefill and decode rows in one extend batch (mix_running_indices)


@dataclass(frozen=True, slots=True)
class Variant:
    """A protocol configuration the conformance run drives."""

    name: str
    spec: str | None  # SGLang's speculative algorithm name, None for non-spec
    needs_cpu_seq_lens: bool
    steps: tuple[Step, ...]
    hip: bool = False


DECODE = (Step(prefill=(1, 2)), Step(decode=(1, 2)), Step(decode=(1, 2)), Step(decode=(1, 2)))
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("non_spec_decode", None, True, DECODE),
    Variant("eagle_spec_v2", "EAGLE", False, DECODE),
    Variant("eagle_d2h_stream", "EAGLE", True, DECODE),
    Variant("chunked_prefill", None, True,
            (Step(prefill=(1,)), Step(prefill=(2,), decode=(1,), mixed=True),
             Step(decode=(1, 2)), Step(decode=(1, 2)))),
    Variant("idle_rank", "EAGLE", True,
            (Step(prefill=(1, 2)), Step(), Step(decode=(1, 2)), Step(decode=(1, 2)))),
    Variant("retracted_request", None, True,
            # request in row 2 retracted after iteration 1; a new request takes the row at once
            (Step(prefill=(1, 2)), Step(decode=(1, 2)), Step(prefill=(2,), decode=(1,), mixed=True),
             Step(decode=(1, 2)))),
)}


@dataclass
class Outcome:
    """What one conformance run found."""

    variant: str
    mutation: str | None
    races: list[Race]
    iterations: int
    unknown_ops: list[str] = field(default_factory=list)  # ops with undeclared accesses
    dropped: int = 0  # syncs (or keep-alive pins) the mutation skipped: 0 means not reached


DEVICE = torch.device("cuda", 0)  # faked on the CPU by recorder.watch(mode="cpu")


class _ReqToTokenPool:
    """The two fields FutureMap reads of SGLang's ReqToTokenPool (device tensors)."""

    def __init__(self) -> None:
        self.req_to_token = torch.zeros((POOL_SIZE, MAX_CONTEXT), dtype=torch.int32,
                                        device=DEVICE)
        self.req_generation = torch.zeros((POOL_SIZE,), dtype=torch.int64)


def _batch(rows: tuple[int, ...], spec_algorithm: Any) -> types.SimpleNamespace:
    """The ScheduleBatch fields overlap_utils reads (the real class needs the server)."""
    return types.SimpleNamespace(
        prefill_input_ids_cpu=None, mix_running_indices=None, mix_running_indices_cpu=None,
        enable_overlap=True, spec_algorithm=spec_algorithm, input_ids=None, spec_info=None,
        req_pool_indices=None, req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None, device=DEVICE,
        out_cache_loc=None, prefix_lens=[],
    )


class LoopDriver:
    """One run: the real FutureMap on (faked) CUDA streams, the replayed overlap loop.

    Runs inside ``recorder.watch(mode="cpu")``: ``torch.cuda`` streams and events are the
    recorder's, ``device="cuda"`` tensors are device memory, ``pin_memory=True`` is pinned."""

    def __init__(self, overlap_utils: types.ModuleType, variant: Variant,
                 mutation: Mutation | None, dropped: list[int] | None = None) -> None:
        self.ou = overlap_utils
        self.variant = variant
        self.mutation = mutation
        self.algo = sglang_env.speculative_algorithm(variant.spec)
        self.schedule_stream = torch.cuda.Stream()  # scheduler.py: torch.cuda.set_stream
        self.forward_stream = torch.cuda.Stream()
        self.copy_stream = torch.cuda.Stream()
        torch.cuda.set_stream(self.schedule_stream)
        self.pool = _ReqToTokenPool()
        self.fm = self.algo.create_future_map(DEVICE, self.pool,
                                              needs_cpu_seq_lens=variant.needs_cpu_seq_lens)
        self.lengths = dict.fromkeys(range(POOL_SIZE), 0)
        self.keep_alive: list[list[Any]] = [[], []]  # record_batch_in_overlap's 2-slot ring
        # (copy_done, device tokens, host tokens) of the last batch: the batch result keeps
        # its device tensors alive until process_batch_result, as SGLang's result queue does
        self.pending: tuple[Any, Any, Any] | None = None
        self.draft: Any = None  # next_draft_input carried between iterations (spec)
        self.read_done: Any = None  # the runner's shared_read_done_event of this forward
        # how often the mutation skipped what it drops (a one-element counter, shared with the
        # record_stream patch of run_variant)
        self.dropped = [0] if dropped is None else dropped

    def run(self) -> None:
        for step in self.variant.steps:
            self.iterate(step)
        self._process_last()

    # -- one iteration ----------------------------------------------------------------------
    def iterate(self, step: Step) -> None:
        rows = step.decode + step.prefill if step.mixed else step.prefill or step.decode
        previous, self.pending = self.pending, None
        batch = self._schedule(step, rows)
        self._run_batch(batch, rows)
        del batch  # the batch's own references go; the keep-alive ring holds what SGLang's does
        if self.mutation is not Mutation.WAR_BARRIER:
            self._war_barrier()
        else:
            self.dropped[0] += 1
        current, self.pending = self.pending, previous
        self._process_last()  # the previous batch's results, after this launch (2116)
        self.pending = current

    def _schedule(self, step: Step, rows: tuple[int, ...]) -> types.SimpleNamespace:
        """get_next_batch_to_run on the schedule stream: indices, KV slots, lengths."""
        batch = _batch(rows, self.algo)
        # non-blocking H2D copies on the schedule stream, as schedule_batch.py makes them
        # (2750-3122); each assigned to a variable first, so the recorder names the buffer
        # after it (it names a ``torch.tensor(..., device=)`` result just "tensor")
        req_pool_indices = torch.tensor(rows, dtype=torch.int64).to(DEVICE, non_blocking=True)
        batch.req_pool_indices = req_pool_indices
        for row in step.prefill:
            self.lengths[row] = 3
        for row in rows:
            self.pool.req_to_token[row, self.lengths[row]] = 100 + row  # the new KV slot
        lens = [self.lengths[r] for r in rows]
        seq_lens = torch.tensor(lens, dtype=torch.int64).to(DEVICE, non_blocking=True)
        out_cache_loc = torch.tensor([100 + r for r in rows], dtype=torch.int64).to(
            DEVICE, non_blocking=True)
        batch.seq_lens, batch.out_cache_loc = seq_lens, out_cache_loc
        batch.seq_lens_cpu = torch.tensor(lens, dtype=torch.int64)
        batch.prefix_lens = list(lens)
        if step.prefill:
            ids = torch.tensor([7 + r for r in step.prefill], dtype=torch.int64)
            batch.prefill_input_ids_cpu = ids.pin_memory()
            if step.mixed:
                batch.mix_running_indices = batch.req_pool_indices[: len(step.decode)]
                batch.mix_running_indices_cpu = batch.req_pool_indices_cpu[: len(step.decode)]
        if self.draft is not None and step.decode and not step.prefill:
            batch.spec_info = self.draft
            self.draft.future_indices = batch.req_pool_indices
        self.draft = None
        return batch

    def _run_batch(self, batch: types.SimpleNamespace, rows: tuple[int, ...]) -> None:
        with self._mutated_resolve(batch):
            self.fm.resolve_seq_lens_cpu(batch)  # run_batch 4667, on the schedule stream
        with torch.cuda.stream(self.forward_stream):
            if self.mutation is not Mutation.FORWARD_NO_WAIT:
                self.forward_stream.wait_stream(self.schedule_stream)  # 4672
            else:
                self.dropped[0] += 1
            self.ou.resolve_forward_inputs(batch, self.fm)  # 4681
            future_indices = batch.req_pool_indices
            self._keep(batch)
            tokens, new_lens = self._forward(batch, rows)
            if self.algo.is_some():
                self.fm.publish(future_indices, new_lens)  # on_publish mid-worker, 4692
                self.draft = self._draft_extend(tokens)
                payload = self.ou.RelayPayload.from_draft_input(self.draft)
            else:
                self.fm.publish(future_indices, batch.seq_lens + 1)  # 4708
                payload = self.ou.RelayPayload(bonus_tokens=tokens)
            self.fm.stash(future_indices, payload)  # _relay_forward_payload, 4971-4987
            copy_done = torch.cuda.Event()
            self.copy_stream.wait_stream(self.forward_stream)  # _copy_result_to_cpu, 5032
            with torch.cuda.stream(self.copy_stream):
                host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
                host_tokens.copy_(tokens, non_blocking=True)
                copy_done.record()
        for row in rows:
            self.lengths[row] += 1
        self.pending = (copy_done, tokens, host_tokens)

    def _war_barrier(self) -> None:
        """_apply_war_barrier (2012-2023): wait the runner's shared_read_done event when it
        published one (the decode graph runner does, decode_cuda_graph_runner.py 689-697),
        else the whole forward stream (EAGLE's draft-extend runner clears the event,
        eagle_draft_extend_cuda_graph_runner.py 666; prefill publishes none here)."""
        event, self.read_done = self.read_done, None
        if event is not None:
            self.schedule_stream.wait_event(event)
        else:
            self.schedule_stream.wait_stream(self.forward_stream)

    def _forward(self, batch: types.SimpleNamespace, rows: tuple[int, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stand-in model forward: reads input ids and the batch's KV rows, samples."""
        # attention reads each row's KV slots up to its length (not the whole row)
        kv = (torch.stack([self.pool.req_to_token[row, : self.lengths[row] + 1].sum()
                           for row in rows]) if rows
              else torch.zeros(0, dtype=torch.int64, device=DEVICE))
        if self.algo.is_none() and batch.prefill_input_ids_cpu is None and rows:
            self.read_done = torch.cuda.Event()  # the decode runner's shared_read_done
            self.read_done.record()
        inputs = (batch.input_ids if batch.input_ids is not None
                  else torch.zeros_like(batch.req_pool_indices))
        tokens = (inputs.to(torch.int64) + kv.to(torch.int64)) % 1000
        new_lens = batch.seq_lens + 1
        return tokens, new_lens

    def _draft_extend(self, tokens: torch.Tensor) -> Any:
        """The draft-extend output the EAGLE v2 worker returns as next_draft_input."""
        count = tokens.shape[0]
        return types.SimpleNamespace(
            bonus_tokens=tokens,
            topk_p=torch.ones((count, TOPK), dtype=torch.float32, device=DEVICE),
            topk_index=(tokens.unsqueeze(1) + torch.arange(TOPK, device=DEVICE)),
            hidden_states=(torch.ones((count, HIDDEN), dtype=torch.float32, device=DEVICE)
                           * tokens.unsqueeze(1)),
            draft_probs=None, dsa_topk_indices=None, future_dsa_topk_indices_available=False,
            future_indices=None,
        )

    def _keep(self, batch: types.SimpleNamespace) -> None:
        """record_batch_in_overlap (4554): pin the batch's tensors for two iterations."""
        if self.mutation in RING_DROPPED:
            self.dropped[0] += 1
            return
        self.keep_alive.append([batch.req_pool_indices, batch.seq_lens])
        self.keep_alive = self.keep_alive[-2:]

    def _process_last(self) -> None:
        """process_batch_result of the previous batch: wait copy_done, read tokens."""
        if self.pending is None:
            return
        copy_done, _tokens, host_tokens = self.pending
        copy_done.synchronize()
        host_tokens.tolist()
        self.pending = None

    # -- mutations of the real code --------------------------------------------------------
    @contextmanager
    def _mutated_resolve(self, batch: types.SimpleNamespace) -> Iterator[None]:
        """PUBLISH_READY_WAIT: resolve_seq_lens_cpu sees an event never recorded, so its
        ``publish_ready.wait()`` and the D2H stream's ``wait_event`` bind to nothing (counted
        as dropped where the resolve gets that far: a batch with future indices).
        PINNED_EARLY: ``fwd_prepare_d2h_stream.synchronize()`` returns at once."""
        fm = self.fm
        saved_event, saved_stream = fm.publish_ready, fm.fwd_prepare_d2h_stream
        if self.mutation is Mutation.PUBLISH_READY_WAIT and fm.publish_ready is not None:
            fm.publish_ready = torch.cuda.Event()
            waits = batch.spec_info is not None and batch.spec_info.future_indices is not None
            self.dropped[0] += int(waits)
        if self.mutation is Mutation.PINNED_EARLY and saved_stream is not None:
            fm.fwd_prepare_d2h_stream = _NoSyncStream(saved_stream, self.dropped)
        try:
            yield
        finally:
            fm.publish_ready, fm.fwd_prepare_d2h_stream = saved_event, saved_stream


class _NoSyncStream:
    """A stream whose host synchronize() is dropped (the PINNED_EARLY mutation)."""

    def __init__(self, stream: Any, dropped: list[int]) -> None:
        self._stream = stream
        self._dropped = dropped

    def synchronize(self) -> None:
        self._dropped[0] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _record_stream_dropped(active: bool, dropped: list[int]) -> Iterator[None]:
    """NO_RECORD_STREAM and RECORD_STREAM: every ``Tensor.record_stream`` in the block is a
    no-op (SGLang's own in ``_resolve_spec_extras`` and ``resolve_forward_inputs`` included);
    the recorder's patch is put back on the way out. Each skipped call counts in ``dropped``."""
    if not active:
        yield
        return
    saved = torch.Tensor.record_stream

    def skipped(tensor: torch.Tensor, stream: Any) -> None:
        dropped[0] += 1

    torch.Tensor.record_stream = skipped  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.record_stream = saved  # type: ignore[method-assign]


def run_variant(variant: str, mutation: Mutation | None = None) -> Outcome:
    """Run one variant (under one mutation) under ``recorder.watch(mode="cpu")``; return the
    races it found."""
    overlap_utils = sglang_env.load_overlap_utils()
    spec = VARIANTS[variant]
    dropped = [0]
    with (recorder.watch(mode="cpu") as watch,
          sglang_env.cuda_branches(overlap_utils, hip=spec.hip),
          _record_stream_dropped(mutation in RECORD_STREAM_DROPPED, dropped)):
        driver = LoopDriver(overlap_utils, spec, mutation, dropped)
        driver.run()
        del driver  # its tensors die inside the watch, so their frees are recorded
    unknown = [f"{op.name} at {op.site} ({', '.join(op.tensors)})" for op in watch.unknown_ops]
    return Outcome(variant, None if mutation is None else str(mutation), watch.races,
                   len(spec.steps), unknown, dropped[0])
