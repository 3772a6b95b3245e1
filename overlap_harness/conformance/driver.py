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

from model.trace import Race
from overlap_harness.conformance import sglang_env
from overlap_harness.conformance.shim import FakeStream, Watch, watch

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
    notes: list[str] = field(default_factory=list)


class _ReqToTokenPool:
    """The two fields FutureMap reads of SGLang's ReqToTokenPool."""

    def __init__(self) -> None:
        self.req_to_token = torch.zeros((POOL_SIZE, MAX_CONTEXT), dtype=torch.int32)
        self.req_generation = torch.zeros((POOL_SIZE,), dtype=torch.int64)


def _batch(rows: tuple[int, ...], spec_algorithm: Any) -> types.SimpleNamespace:
    """The ScheduleBatch fields overlap_utils reads (the real class needs the server)."""
    return types.SimpleNamespace(
        prefill_input_ids_cpu=None, mix_running_indices=None, mix_running_indices_cpu=None,
        enable_overlap=True, spec_algorithm=spec_algorithm, input_ids=None, spec_info=None,
        req_pool_indices=None, req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
        seq_lens=None, seq_lens_cpu=None, seq_lens_sum=None, device="cpu",
        out_cache_loc=None, prefix_lens=[],
    )


class LoopDriver:
    """One run: the real FutureMap, fake streams, the replayed overlap loop."""

    def __init__(self, overlap_utils: types.ModuleType, variant: Variant, recorder: Watch,
                 mutation: Mutation | None) -> None:
        self.ou = overlap_utils
        self.variant = variant
        self.w = recorder
        self.mutation = mutation
        self.algo = sglang_env.speculative_algorithm(variant.spec)
        self.pool = _ReqToTokenPool()
        recorder.name(self.pool.req_to_token, "req_to_token")
        self.schedule_stream: FakeStream = recorder.current
        self.forward_stream = recorder.new_stream("forward_stream")
        self.copy_stream = recorder.new_stream("copy_stream")
        self.fm = self.algo.create_future_map(torch.device("cpu"), self.pool,
                                              needs_cpu_seq_lens=variant.needs_cpu_seq_lens)
        self.fm.fwd_prepare_d2h_stream.rename("fwd_prepare_d2h_stream")
        for attr in ("output_tokens_buf", "new_seq_lens_buf", "new_seq_lens_cpu_pinned"):
            tensor = getattr(self.fm, attr, None)
            if tensor is not None:
                recorder.name(tensor, attr.removesuffix("_buf"))
        self.lengths = dict.fromkeys(range(POOL_SIZE), 0)
        self.keep_alive: list[list[Any]] = [[], []]  # record_batch_in_overlap's 2-slot ring
        self.pending: tuple[Any, Any] | None = None  # (copy_done, host tokens) of last batch
        self.draft: Any = None  # next_draft_input carried between iterations (spec)
        self.read_done: Any = None  # the runner's shared_read_done_event of this forward

    def run(self) -> None:
        for iteration, step in enumerate(self.variant.steps):
            self.w.iteration = iteration
            self.iterate(step)
        self.w.iteration = len(self.variant.steps)
        self._process_last()

    # -- one iteration ----------------------------------------------------------------------
    def iterate(self, step: Step) -> None:
        rows = step.decode + step.prefill if step.mixed else step.prefill or step.decode
        previous, self.pending = self.pending, None
        batch = self._schedule(step, rows)
        self._run_batch(batch, step, rows)
        if self.mutation is not Mutation.WAR_BARRIER:
            self._war_barrier()
        current, self.pending = self.pending, previous
        self._process_last()  # the previous batch's results, after this launch (2116)
        self.pending = current

    def _schedule(self, step: Step, rows: tuple[int, ...]) -> types.SimpleNamespace:
        """get_next_batch_to_run on the schedule stream: indices, KV slots, lengths."""
        batch = _batch(rows, self.algo)
        self.w.host(batch.req_pool_indices_cpu, "req_pool_indices_cpu")
        indices = torch.tensor(rows, dtype=torch.int64)  # an H2D on the schedule stream
        batch.req_pool_indices = self.w.allocate(indices, "req_pool_indices")
        for row in step.prefill:
            self.lengths[row] = 3
        for row in rows:
            self.pool.req_to_token[row, self.lengths[row]] = 100 + row  # KV slot of the new token
        lens = [self.lengths[r] for r in rows]
        batch.seq_lens = self._device(torch.tensor(lens, dtype=torch.int64))
        batch.seq_lens_cpu = self.w.host(torch.tensor(lens, dtype=torch.int64), "seq_lens_cpu")
        batch.out_cache_loc = self._device(torch.tensor([100 + r for r in rows]))
        batch.prefix_lens = list(lens)
        if step.prefill:
            ids = torch.tensor([7 + r for r in step.prefill], dtype=torch.int64)
            batch.prefill_input_ids_cpu = self.w.host(ids, "prefill_input_ids_cpu")
            if step.mixed:
                batch.mix_running_indices = batch.req_pool_indices[: len(step.decode)]
                batch.mix_running_indices_cpu = batch.req_pool_indices_cpu[: len(step.decode)]
        if self.draft is not None and step.decode and not step.prefill:
            batch.spec_info = self.draft
            self.draft.future_indices = batch.req_pool_indices
        return batch

    def _run_batch(self, batch: types.SimpleNamespace, step: Step, rows: tuple[int, ...]
                   ) -> None:
        with self._mutated_resolve():
            self.fm.resolve_seq_lens_cpu(batch)  # run_batch 4667, on the schedule stream
        with self.w.on(self.forward_stream):
            if self.mutation is not Mutation.FORWARD_NO_WAIT:
                self.forward_stream.wait_stream(self.schedule_stream)  # 4672
            with self._declared_gather():
                self.ou.resolve_forward_inputs(batch, self.fm)  # 4681
            future_indices = batch.req_pool_indices
            self._keep(batch)
            tokens, new_lens = self._forward(batch, rows)
            if self.algo.is_some():
                self.fm.publish(future_indices, new_lens)  # on_publish mid-worker, 4692
                self.draft = self._draft_extend(tokens, rows)
                payload = self.ou.RelayPayload.from_draft_input(self.draft)
            else:
                self.fm.publish(future_indices, batch.seq_lens + 1)  # 4708
                payload = self.ou.RelayPayload(bonus_tokens=tokens)
            self.fm.stash(future_indices, payload)  # _relay_forward_payload, 4971-4987
            for attr in ("topk_p_buf", "topk_index_buf", "hidden_states_buf"):
                if getattr(self.fm, attr) is not None:
                    self.w.name(getattr(self.fm, attr), attr.removesuffix("_buf"))
            copy_done = self.w.cuda.Event()
            self.copy_stream.wait_stream(self.forward_stream)  # _copy_result_to_cpu, 5032
            with self.w.on(self.copy_stream):
                host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
                host_tokens.copy_(tokens, non_blocking=True)
                copy_done.record()
        if self.mutation is Mutation.NO_RECORD_STREAM:
            self.keep_alive = [[], []]
            self.w.free(future_indices)
        for row in rows:
            self.lengths[row] += 1
        self.pending = (copy_done, host_tokens)

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

    def _device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A new device tensor made by the schedule stream (never an older block)."""
        self.w.fresh(tensor, "device")
        return tensor

    def _forward(self, batch: types.SimpleNamespace, rows: tuple[int, ...]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stand-in model forward: reads input ids and the batch's KV rows, samples."""
        idx = batch.req_pool_indices
        # attention reads each row's KV slots up to its length (not the whole row)
        kv = torch.stack([self.pool.req_to_token[row, : self.lengths[row] + 1].sum()
                          for row in rows]) if rows else torch.zeros(0, dtype=torch.int64)
        if self.algo.is_none() and batch.prefill_input_ids_cpu is None and rows:
            self.read_done = self.w.cuda.Event()  # the decode runner's shared_read_done
            self.read_done.record()
        inputs = batch.input_ids if batch.input_ids is not None else torch.zeros_like(idx)
        tokens = (inputs.to(torch.int64) + kv.to(torch.int64)) % 1000
        new_lens = batch.seq_lens + 1
        return tokens, new_lens

    def _draft_extend(self, tokens: torch.Tensor, rows: tuple[int, ...]) -> Any:
        """The draft-extend output the EAGLE v2 worker returns as next_draft_input."""
        count = tokens.shape[0]
        return types.SimpleNamespace(
            bonus_tokens=tokens, topk_p=torch.ones((count, TOPK), dtype=torch.float32),
            topk_index=(tokens.unsqueeze(1) + torch.arange(TOPK)).to(torch.int64),
            hidden_states=torch.ones((count, HIDDEN), dtype=torch.float32) * tokens.unsqueeze(1),
            draft_probs=None, dsa_topk_indices=None, future_dsa_topk_indices_available=False,
            future_indices=None,
        )

    def _keep(self, batch: types.SimpleNamespace) -> None:
        """record_batch_in_overlap (4554): pin the batch's tensors for two iterations."""
        if self.mutation is Mutation.NO_RECORD_STREAM:
            return
        self.keep_alive.append([batch.req_pool_indices, batch.seq_lens])
        self.keep_alive = self.keep_alive[-2:]

    def _process_last(self) -> None:
        """process_batch_result of the previous batch: wait copy_done, read tokens."""
        if self.pending is None:
            return
        copy_done, host_tokens = self.pending
        copy_done.synchronize()
        host_tokens.tolist()
        self.pending = None

    # -- mutations of the real code --------------------------------------------------------
    @contextmanager
    def _mutated_resolve(self) -> Iterator[None]:
        """PUBLISH_READY_WAIT: resolve_seq_lens_cpu sees an event never recorded, so its
        ``publish_ready.wait()`` and the D2H stream's ``wait_event`` bind to nothing.
        PINNED_EARLY: ``fwd_prepare_d2h_stream.synchronize()`` returns at once."""
        fm = self.fm
        saved_event, saved_stream = fm.publish_ready, fm.fwd_prepare_d2h_stream
        if self.mutation is Mutation.PUBLISH_READY_WAIT and fm.publish_ready is not None:
            fm.publish_ready = self.w.cuda.Event()
        if self.mutation is Mutation.PINNED_EARLY and saved_stream is not None:
            fm.fwd_prepare_d2h_stream = _NoSyncStream(saved_stream)
        try:
            yield
        finally:
            fm.publish_ready, fm.fwd_prepare_d2h_stream = saved_event, saved_stream

    @contextmanager
    def _declared_gather(self) -> Iterator[None]:
        """The Triton gather runs interpreted and unseen; declare its reads and writes."""
        real = self.ou.gather_spec_extras

        def gather(indices: torch.Tensor, *bufs: torch.Tensor | None) -> Any:
            reads = [(indices, None), *[(b, indices) for b in bufs if b is not None]]
            return self.w.declare("gather_spec_extras", real, reads, indices, *bufs)
        self.ou.gather_spec_extras = gather
        try:
            yield
        finally:
            self.ou.gather_spec_extras = real


class _NoSyncStream:
    """A stream whose host synchronize() is dropped (the PINNED_EARLY mutation)."""

    def __init__(self, stream: FakeStream) -> None:
        self._stream = stream

    def synchronize(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_variant(variant: str, mutation: Mutation | None = None) -> Outcome:
    """Run one variant (under one mutation) and return the races the detector found."""
    overlap_utils = sglang_env.load_overlap_utils()
    spec = VARIANTS[variant]
    with watch() as recorder, sglang_env.cuda_branches(overlap_utils, hip=spec.hip):
        LoopDriver(overlap_utils, spec, recorder, mutation).run()
    return Outcome(variant, None if mutation is None else str(mutation), list(recorder.races),
                   len(spec.steps))
