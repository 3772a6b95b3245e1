"""TokenSpeed's one-forward-thread loop (``protocol.loop = "one_forward_thread"``).

The design, as TokenSpeed 0.1.1 runs it (docs/tokenspeed.md; facts read from its
``runtime/execution/model_executor.py``, ``device.py``, ``forward_thread.py`` and
``runtime/engine/event_loop.py``, nothing copied): the event loop plans and commits and issues
no GPU work; one forward thread issues all of it, in FIFO order. Per round the forward thread

1. zeroes the KV pages the round hands out, on the **default** stream (the plan's
   sanitization, ``zero_cache_pages``);
2. where the round extends requests, makes the **execution** stream wait on the default stream
   and writes their valid cache lengths there (``_write_valid_cache_lengths``, label
   ``exec.cache_lengths_wait``);
3. makes the execution stream wait on the default stream (``execute_forward_op``, label
   ``exec.forward_wait``), fills the input buffers from fresh pinned blocks (non-blocking
   uploads) and gathers each decode's input ids from the token table, a table keyed by
   request-pool row whose row 0 is never handed out;
4. runs the forward (reads the inputs and the batch's pages, writes the pages and the packed
   output), writes the next round's ids into the token table (a drafter does it when
   ``draft_width`` > 0), copies the output non-blocking into a fresh pinned tensor and records
   a fresh copy event (label ``copy_event.record``).

The event loop commits round n-1 after handing round n over (``in_flight_depth`` 1; 0: round
n at once): it waits on the round's copy event on the host (label ``copy_event.host_wait``)
and reads the pinned output.

Two host threads are one host agent here. Their hand-over orders the commit of round n-1
before the issue of round n+1 (the loop hands round n+1 over after committing n-1) and the
issue of round n before its commit (the future); the model issues round n and then commits
round n-1, which adds only an order between the forward thread's host work of round n and
the event loop's commit of round n-1 (concurrent in TokenSpeed). So a race between those two
threads' host accesses is not modelled; every device access keeps its order. Not modelled
either: CUDA graph replays (a replay has the eager forward's accesses), the sampler's coin
refill, page reuse after a request finishes, the staging blocks' return to the host allocator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from overlap_harness.model.config import EventKind, ProtocolConfig, Request, Timing, Workload
from overlap_harness.model.device import Buffer, Device, Event, SyncLabel
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol.outcome import ProtocolOutcome

I64 = torch.int64
VOCAB = 64


def next_token(token: int) -> int:
    """The forward's value model: a request's next token from its last input token."""
    return (token * 7 + 3) % VOCAB


def prompt_tokens(request: Request) -> list[int]:
    """A request's prompt ids (a function of its name, so the oracle sees the same)."""
    base = sum(ord(c) for c in request.id) % VOCAB
    return [(base + i) % VOCAB for i in range(request.prompt_len)]


@dataclass
class _Req:
    spec: Request
    row: int
    prompt: list[int]
    extended: int = 0  # prompt tokens extended (or found cached)
    cached: int = 0  # tokens the request's pages hold: its extends, then width per decode
    scheduled: int = 0  # output tokens the scheduler has asked for
    chunk: int = 0  # prompt tokens per extend (chunked prefill), set at its first extend
    pages: list[int] = field(default_factory=list)

    @property
    def prefilled(self) -> bool:
        return self.extended >= len(self.prompt)


@dataclass
class _Step:
    """One request's part of a round: an extend of ``length`` prompt tokens from ``start``,
    or a decode (``length`` = the decode width)."""

    req: _Req
    extend: bool
    start: int
    length: int
    gives_token: bool  # an extend's last chunk, or a decode


@dataclass
class _InFlight:
    iteration: int
    steps: list[_Step]
    widths: list[int]
    output: Buffer
    copy_event: Event


class OneForwardThreadLoop:
    """The loop's state and its two sides: :meth:`issue` (the forward thread) and
    :meth:`commit` (the event loop)."""

    def __init__(self, device: Device, config: ProtocolConfig, workload: Workload,
                 timing: Timing, outcome: ProtocolOutcome) -> None:
        self.device, self.config, self.timing, self.outcome = device, config, timing, outcome
        self.workload = workload
        self.width = 1 + config.draft_width
        self.default = device.stream("default")
        self.execution = device.stream("execution")
        rows = config.pool_size - 1  # row 0 is never handed out
        if len(workload.requests) > rows:
            raise HarnessError(f"protocol.pool_size = {config.pool_size}: {rows} request rows "
                               f"(row 0 reserved) for {len(workload.requests)} requests")
        self.reqs = [_Req(r, i + 1, prompt_tokens(r)) for i, r in enumerate(workload.requests)]
        for r in self.reqs:
            outcome.request(r.spec.id)
        self.next_page = 1  # page 0 is never handed out
        max_tokens = sum(r.prompt_len for r in workload.requests) + self.width * len(self.reqs)
        pages = 2 + sum(math.ceil((r.prompt_len + r.max_new + self.width) / config.page_size)
                        for r in workload.requests)
        default = self.default
        # made as the executor's __init__ makes them: on the default stream
        self.kv = device.buffer("kv_pages", (pages, config.page_size), I64, fill=0,
                                stream=default)
        self.valid_cache_lengths = device.buffer("valid_cache_lengths", (config.pool_size,),
                                                 I64, fill=0, stream=default)
        self.token_table = device.buffer("future_input_map", (config.pool_size, self.width),
                                         I64, fill=0, stream=default)
        self.input_ids = device.buffer("input_ids_buf", (max_tokens,), I64, fill=0,
                                       stream=default)
        self.pool_rows = device.buffer("req_pool_indices_buf", (len(self.reqs),), I64,
                                       fill=0, stream=default)
        self.output_pack = device.buffer("output_pack_buf", (self.width * len(self.reqs),),
                                         I64, fill=0, stream=default)

    # -- the scheduler's plan (host, no GPU work) -----------------------------------------
    def plan(self, n: int) -> list[_Step]:
        """Round ``n``: extends first (a chunk of each arrived prompt), then decodes."""
        steps: list[_Step] = []
        for r in self.reqs:
            if r.spec.arrive > n or r.prefilled:
                continue
            if r.chunk == 0:  # its first extend
                if r.spec.arrive > 0 and self.config.cached_prefix:
                    r.extended = r.cached = min(self.config.cached_prefix, len(r.prompt) - 1)
                    self._grow(r, [])  # cached pages: already there, not zeroed
                r.chunk = math.ceil((len(r.prompt) - r.extended) / r.spec.chunks)
            length = min(r.chunk, len(r.prompt) - r.extended)
            last = r.extended + length >= len(r.prompt)
            steps.append(_Step(r, True, r.extended, length, last))
        for r in self.reqs:
            if r.prefilled and 0 < r.scheduled < r.spec.max_new and not any(
                    s.req is r for s in steps):
                steps.append(_Step(r, False, r.cached, self.width, True))
        return steps

    def _grow(self, r: _Req, fresh: list[int]) -> None:
        while len(r.pages) * self.config.page_size < r.cached:
            r.pages.append(self.next_page)
            fresh.append(self.next_page)
            self.next_page += 1

    # -- the forward thread ---------------------------------------------------------------
    def issue(self, n: int, steps: list[_Step]) -> _InFlight:
        """Everything the forward thread enqueues for round ``n``."""
        device, default, execution = self.device, self.default, self.execution
        fresh: list[int] = []
        for s in steps:
            s.req.cached += s.length
            if s.extend:
                s.req.extended += s.length
            if s.gives_token:
                s.req.scheduled += 1 if s.extend else self.width
            self._grow(s.req, fresh)
        if fresh:  # the plan's sanitization of the pages it hands out
            device.launch(default, "zero_cache_pages",
                          lambda: torch.zeros(len(fresh), self.config.page_size, dtype=I64),
                          writes=[(self.kv, fresh)], cost_us=self.timing.schedule_kernel)
        extends = [s for s in steps if s.extend]
        if extends:
            self._write_valid_cache_lengths(extends)
        device.wait_stream(execution, default, SyncLabel.EXEC_FORWARD_WAIT)
        rows = [s.req.row for s in steps]
        ends = self._fill_inputs(steps, rows)
        widths = [1 if s.extend else self.width for s in steps]
        self._forward(steps, rows, ends, widths)
        out_n = sum(widths)
        output = device.buffer(f"cpu_pack_{n}", (out_n,), I64, pinned=True)
        device.copy(execution, (self.output_pack, slice(0, out_n)), output, non_blocking=True,
                    cost_us=self.timing.d2h, name="output_d2h")
        copy_event = device.event(f"copy_event_{n}")
        device.record(copy_event, execution, SyncLabel.COPY_EVENT_RECORD)
        return _InFlight(n, steps, widths, output, copy_event)

    def _write_valid_cache_lengths(self, extends: list[_Step]) -> None:
        device, execution = self.device, self.execution
        device.wait_stream(execution, self.default, SyncLabel.EXEC_CACHE_LENGTHS_WAIT)
        rows = [s.req.row for s in extends]
        values = self._upload("valid_cache_lengths_cpu", [s.start for s in extends])
        device.launch(execution, "reset_states", lambda v: v, reads=[values],
                      writes=[(self.valid_cache_lengths, rows)],
                      cost_us=self.timing.schedule_kernel)

    def _upload(self, name: str, values: list[int]) -> Buffer:
        """A fresh pinned block filled on the host, copied non-blocking to a fresh device
        tensor on the execution stream (TokenSpeed's ``_bulk_pinned``: never persistent)."""
        device = self.device
        staged = device.buffer(name, (len(values),), I64, pinned=True)
        device.host_write(staged, None, torch.tensor(values, dtype=I64), name=f"fill_{name}")
        target = device.buffer(name.removesuffix("_cpu"), (len(values),), I64,
                               stream=self.execution)
        device.copy(self.execution, staged, target, non_blocking=True,
                    cost_us=self.timing.schedule_kernel, name=f"upload_{name}")
        return target

    # each op's function gets the whole value of every buffer it reads (the device's
    # convention) and returns what lands in the selection it writes

    def _fill_inputs(self, steps: list[_Step], rows: list[int]) -> list[int]:
        """The input buffers: extend ids and pool rows uploaded, decode ids gathered from the
        token table on the execution stream; returns each step's end in ``input_ids``."""
        device, execution = self.device, self.execution
        rows_dev = self._upload("req_pool_indices_cpu", rows)
        device.launch(execution, "fill_pool_rows", lambda v: v, reads=[rows_dev],
                      writes=[(self.pool_rows, slice(0, len(rows)))],
                      cost_us=self.timing.schedule_kernel)
        ends, end = [], 0
        extend_ids = [t for s in steps if s.extend
                      for t in s.req.prompt[s.start:s.start + s.length]]
        if extend_ids:
            ids_dev = self._upload("input_ids_cpu", extend_ids)
            device.launch(execution, "fill_extend_ids", lambda v: v, reads=[ids_dev],
                          writes=[(self.input_ids, slice(0, len(extend_ids)))],
                          cost_us=self.timing.schedule_kernel)
        for s in steps:
            if s.extend:
                end += s.length
                ends.append(end)
        decode_rows = [s.req.row for s in steps if not s.extend]
        if decode_rows:
            span = slice(end, end + self.width * len(decode_rows))
            device.launch(execution, "decode_input_prep", lambda t: t[decode_rows].reshape(-1),
                          reads=[(self.token_table, decode_rows)],
                          writes=[(self.input_ids, span)], cost_us=self.timing.schedule_kernel)
            ends += [end + self.width * (i + 1) for i in range(len(decode_rows))]
        return ends

    def _forward(self, steps: list[_Step], rows: list[int], ends: list[int],
                 widths: list[int]) -> None:
        device, execution = self.device, self.execution
        pages = sorted({p for s in steps for p in s.req.pages})
        width = self.width
        out_n = sum(widths)

        def model(ids: torch.Tensor, _rows: torch.Tensor, _lengths: torch.Tensor,
                  kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = []
            for end, w in zip(ends, widths, strict=True):
                last = int(ids[end - 1])
                tokens += [next_token(last + c) for c in range(w)]
            return kv[pages] + 1, torch.tensor(tokens, dtype=I64)

        device.launch(execution, "model_forward",
                      model, reads=[(self.input_ids, slice(0, ends[-1])),
                                    (self.pool_rows, slice(0, len(rows))),
                                    (self.valid_cache_lengths, rows), (self.kv, pages)],
                      writes=[(self.kv, pages), (self.output_pack, slice(0, out_n))],
                      cost_us=self.timing.forward, observe="model_forward")
        # the next round's input ids, keyed by pool row: a drafter's 1 + k ids, else the
        # sampled token in every column
        name = "drafter" if self.config.draft_width else "update_runtime_state"

        def next_ids(out: torch.Tensor) -> torch.Tensor:
            table, at = [], 0
            for w in widths:
                last = int(out[at + w - 1])
                table.append([next_token(last + c) if self.config.draft_width else last
                              for c in range(width)])
                at += w
            return torch.tensor(table, dtype=I64)

        device.launch(execution, name, next_ids, reads=[(self.output_pack, slice(0, out_n))],
                      writes=[(self.token_table, rows)], cost_us=self.timing.schedule_kernel)

    # -- the event loop -------------------------------------------------------------------
    def commit(self, done: _InFlight) -> None:
        """The event loop's commit of a round: wait on its copy event, read its output."""
        device = self.device
        device.host_work("commit", self.timing.process_results)
        device.synchronize(done.copy_event, SyncLabel.COPY_EVENT_HOST_WAIT)
        values = device.host_read(done.output, None, name="commit_read").tolist()
        at = 0
        for s, w in zip(done.steps, done.widths, strict=True):
            got = values[at:at + w]
            at += w
            if not s.gives_token:
                continue
            record = self.outcome.request(s.req.spec.id)
            record.tokens = (record.tokens + [int(t) for t in got])[:s.req.spec.max_new]
            if len(record.tokens) >= s.req.spec.max_new and record.finished_at is None:
                record.finished_at = done.iteration


def run_one_forward_thread(device: Device, config: ProtocolConfig, workload: Workload,
                           timing: Timing) -> ProtocolOutcome:
    """Run ``workload`` through the one-forward-thread loop on ``device``."""
    outcome = ProtocolOutcome()
    loop = OneForwardThreadLoop(device, config, workload, timing, outcome)
    in_flight: list[_InFlight] = []
    idle = {e.at for e in workload.events if e.kind == EventKind.IDLE}
    for n in range(workload.iterations):
        device.set_iteration(n)
        device.host_work("plan", timing.schedule_prep)
        steps = [] if n in idle else loop.plan(n)
        outcome.batches[n] = [s.req.spec.id for s in steps]
        kinds = {s.extend for s in steps}
        outcome.batch_kinds[n] = ("idle" if not steps else "mixed" if len(kinds) == 2
                                  else "prefill" if True in kinds else "decode")
        if steps:
            in_flight.append(loop.issue(n, steps))
        # a round with no forward commits everything in flight
        keep = config.in_flight_depth if steps else 0
        while len(in_flight) > keep:
            loop.commit(in_flight.pop(0))
    device.set_iteration(workload.iterations)
    while in_flight:
        loop.commit(in_flight.pop(0))
    return outcome
