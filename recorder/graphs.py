"""CUDA graphs in both modes: a capture records a template, each replay re-issues it.

STREAM-SEMANTICS.md "CUDA graphs": a capture (``CUDAGraph.capture_begin/end``,
``torch.cuda.graph``) runs nothing on the device. While one is under way the recording hands
every node issued on a capturing stream to :class:`GraphCapture` (``Recording.capture``): the
ops with their accesses, the event records and waits, in captured order. A stream joins the
capture when it waits on a record made inside it (a fork); every such stream must be joined
back into the capture stream before ``capture_end``, as CUDA requires
(``cudaErrorStreamCaptureUnjoined``). Work on other streams meanwhile is not part of the graph.

``replay()`` issues the template on the stream current at the replay: the capture stream's
nodes on that stream, each forked stream's nodes on a stream agent of the graph's own
(``g/side``), the captured records and waits between them kept, so the fork/join order holds
and a captured event (``Event(external=True)``) is recorded again at each replay, where waits
issued later bind to it. A replay also starts after the graph's previous replay (CUDA orders
each launch of a graph behind its previous launch). Each replay re-does every captured access
on the same tensors, so the next replay's writes race a read of the previous replay's output
that nothing orders before them.

Values. CPU mode computes an op when it runs; a captured op must not run, yet its fresh outputs
must exist: :meth:`GraphCapture.run_unapplied` runs it and puts back what it wrote, and
each replay runs every captured op again on the captured tensors (the static inputs and
outputs), copying fresh results into the captured outputs, and takes an indexing op's elements
from the index values of the moment. GPU mode runs nothing itself (the real graph does) and,
since reading index values during a capture would break it, records an indexing op in a graph
as touching its whole view.

Memory: allocations on a capturing stream come from the graph's private pool
(``graph_pool_handle()``, ``pool=``; see :mod:`model.allocator`); ``reset()`` releases it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Access, Recording, Replayable
from overlap_harness.recorder.elements import index_elements, is_indexing, schema_accesses
from overlap_harness.recorder.sites import split_site, user_site

aten = torch.ops.aten


@dataclass(slots=True)
class CapturedOp:
    """An op of the template, with how CPU mode redoes it."""

    name: str
    agent: int
    kind: OpKind
    site: str
    accesses: list[Access]
    replay: Replayable | None


@dataclass(frozen=True, slots=True)
class CapturedEvent:
    """An event record (``wait`` False) or wait of the template."""

    key: object
    agent: int
    name: str
    wait: bool


Entry = CapturedOp | CapturedEvent


class GraphCapture:
    """One capture under way: the template being recorded (``Recording.capture``)."""

    def __init__(self, origin: int, pool: object, computes: bool) -> None:
        self.origin = origin
        self.pool = pool
        self.computes = computes  # CPU mode: values are computed on the host
        self.entries: list[Entry] = []
        # per capturing stream, the newest template entry of each stream it is ordered after
        self._clocks: dict[int, dict[int, int]] = {origin: {}}
        self._records: dict[object, dict[int, int]] = {}  # captured key -> its clock

    def takes(self, agent: int) -> bool:
        return agent in self._clocks

    def pool_tag(self, agent: int) -> object | None:
        return self.pool if agent in self._clocks else None

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self._clocks[entry.agent][entry.agent] = len(self.entries) - 1

    def op(self, name: str, agent: int, accesses: Sequence[Access], kind: OpKind, site: str,
           replay: Replayable | None) -> None:
        self._add(CapturedOp(name, agent, kind, site, list(accesses), replay))

    def record(self, event_key: object, agent: int, name: str) -> bool:
        if agent not in self._clocks:
            self._records.pop(event_key, None)  # recorded outside: no longer the graph's
            return False
        self._add(CapturedEvent(event_key, agent, name, False))
        self._records[event_key] = dict(self._clocks[agent])
        return True

    def wait(self, event_key: object, agent: int, name: str) -> bool:
        bound = self._records.get(event_key)
        if bound is None and agent not in self._clocks:
            return False
        clock = self._clocks.setdefault(agent, {})  # a wait on a captured record: a fork
        for other, index in (bound or {}).items():
            clock[other] = max(clock.get(other, -1), index)
        self._add(CapturedEvent(event_key, agent, name, True))
        return True

    def unjoined(self) -> list[int]:
        """Forked streams whose last captured work the capture stream is not ordered after."""
        known = self._clocks[self.origin]
        return [agent for agent, clock in self._clocks.items()
                if agent != self.origin and clock.get(agent, -1) > known.get(agent, -1)]

    def run_unapplied(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run a captured aten op for its outputs and, in CPU mode, put back what it wrote
        (a capture runs nothing; GPU mode only enqueues it into the real graph)."""
        if not self.computes:
            return func(*args, **kwargs)
        with torch._C.DisableTorchFunction():
            restores = [_saved(func, args, kwargs, t)
                        for t, write in schema_accesses(func, args, kwargs) if write]
            out = func(*args, **kwargs)
            for restore in restores:
                restore()
        return out

    def replayable(self, mode: Any, func: Any, args: tuple, kwargs: dict, out: Any,
                   inputs: list, written: list[Access]) -> Replayable | None:
        """How CPU mode redoes a captured aten op (None in GPU mode): run it again on the
        captured tensors, copying fresh results into the captured outputs; an indexing op's
        accesses from the index values at the replay."""
        if not self.computes:
            return None
        values = out if isinstance(out, tuple | list) else (out,)
        fresh = {id(a.info) for a in written}
        outputs = [(position, v) for position, v in enumerate(values)
                   if isinstance(v, torch.Tensor) and id(mode.memory.lookup(v)) in fresh]
        accesses = None
        if is_indexing(func):
            def accesses() -> list[Access]:
                return mode.input_accesses(func, args, kwargs, inputs) + written
        return Replayable(functools.partial(_rerun, func, args, kwargs, outputs), accesses)


def _saved(func: Any, args: tuple, kwargs: dict, t: torch.Tensor) -> Callable[[], None]:
    """What puts back the elements an op is about to write in ``t``: only those its index
    values pick for an indexing op (a KV-cache write saves its rows, not the cache)."""
    picked = index_elements(func, args, kwargs) if t is args[0] and is_indexing(func) else None
    if picked is None:
        values = aten.clone.default(t)

        def restore() -> None:
            if t.shape == values.shape:  # an ``out=`` the op resized keeps its new values
                aten.copy_.default(t, values)
        return restore
    ids = torch.from_numpy(picked[0])
    flat = aten.as_strided.default(t, (t.untyped_storage().nbytes() // t.element_size(),),
                                   (1,), 0)
    rows = aten.index.Tensor(flat, [ids])
    return lambda: aten.index_put_.default(flat, [ids], rows)


def _rerun(func: Any, args: tuple, kwargs: dict, outputs: list[tuple[int, torch.Tensor]]) -> None:
    """Run a captured op again; its fresh results land in the captured output tensors."""
    result = func(*args, **kwargs)
    values = result if isinstance(result, tuple | list) else (result,)
    for position, static in outputs:
        aten.copy_.default(static, values[position])


class GraphSet:
    """The CUDA graphs of one watch: their recording, the private pools in use, and how CPU
    mode pauses the recording while a replay computes values."""

    def __init__(self, recording: Recording, computes: bool, dispatch: Any,
                 refuse: Callable[[str, str], NoReturn]) -> None:
        self.recording = recording
        self.computes = computes
        self.dispatch = dispatch
        # ``refuse(what, instead)`` raises the watch's one-line error for an unmodelled API
        self.refuse = refuse
        self._numbers = itertools.count(1)
        self._pool_users: dict[object, int] = {}
        self.capture_stream: Any = None  # CPU mode: torch.cuda.graph's default capture stream

    def new_pool(self) -> tuple[int, int]:
        """A fresh private pool token (CPU mode's ``graph_pool_handle()``)."""
        return (0, next(self._numbers))

    def new_graph(self, name: str | None) -> GraphState:
        number = next(self._numbers)
        return GraphState(self, number, name or f"graph{number}")

    def use_pool(self, pool: object) -> None:
        self._pool_users[pool] = self._pool_users.get(pool, 0) + 1

    def leave_pool(self, pool: object) -> None:
        """A graph stops using ``pool``; the last one releases it to the allocator model."""
        self._pool_users[pool] -= 1
        if not self._pool_users[pool]:
            del self._pool_users[pool]
            self.recording.pool.release_graph_pool(pool)


class GraphState:
    """One graph: its template once captured, its pool, where it was last replayed."""

    def __init__(self, graphs: GraphSet, number: int, name: str) -> None:
        self.graphs = graphs
        self.number = number
        self.name = name
        self.template: list[Entry] | None = None
        self.pool: object | None = None
        self._capture: GraphCapture | None = None
        self._origin_agent = -1  # the capture stream
        self._last_end: tuple[int, int] | None = None  # (agent, op) that ended the last replay

    def begin(self, agent: int, pool: object | None) -> None:
        """``capture_begin`` on the stream of ``agent``, into ``pool`` (a new one if None)."""
        recording = self.graphs.recording
        if recording.capture is not None:
            self.graphs.refuse("a second CUDA graph capture while one is under way", "")
        if self.template is not None or self._capture is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph; make a "
                               "new instance to capture a new graph (or reset() this one)")
        self.pool = self.graphs.new_pool() if pool is None else tuple(pool)
        self.graphs.use_pool(self.pool)
        self._origin_agent = agent
        self._capture = GraphCapture(agent, self.pool, self.graphs.computes)
        recording.capture = self._capture

    def abandon(self) -> None:
        """The capture failed (its block raised): drop it, keep the program's own error."""
        if self._capture is not None and self.graphs.recording.capture is self._capture:
            self.graphs.recording.capture = None
        self._capture = None

    def end(self) -> None:
        """``capture_end``: the template is complete (every forked stream joined back)."""
        capture, self._capture = self._capture, None
        if capture is None:
            raise RuntimeError("capture_end without a capture_begin on this CUDAGraph")
        self.graphs.recording.capture = None
        names = self.graphs.recording.detector.agent_names
        unjoined = [names[a] for a in capture.unjoined()]
        if unjoined:
            raise RuntimeError(f"CUDA error: capturing stream has unjoined work ("
                               f"{', '.join(unjoined)} forked from the capture and was not "
                               "joined back into the capture stream before capture_end)")
        self.template = capture.entries

    def replay(self, agent: int) -> None:
        """Issue the template on ``agent`` after what it holds (see the module docstring)."""
        if self.template is None:
            raise RuntimeError("Called CUDAGraph.replay without a preceding successful capture")
        recording = self.graphs.recording
        if recording.capture is not None and recording.capture.takes(agent):
            self.graphs.refuse("a CUDA graph replay inside another graph's capture (a child graph)",
                               "")
        site = user_site()
        if self._last_end is not None and self._last_end[0] != agent:
            recording.op(f"{self.name}.replay (after its previous replay)", agent, (),
                         OpKind.WAIT, joins=[self._last_end[1]], site=site)
        agents = {}
        for entry in self.template:
            on = agents.get(entry.agent)
            if on is None:
                on = agents[entry.agent] = self._replay_agent(entry.agent, agent)
            if isinstance(entry, CapturedEvent):
                issue = recording.wait if entry.wait else recording.record
                issue(entry.key, on, f"{self.name}.replay: {entry.name}")
                continue
            accesses = entry.accesses
            if entry.replay is not None:
                self._compute(entry.replay.values)
                if entry.replay.accesses is not None:
                    self.graphs.dispatch.paused += 1
                    try:
                        accesses = entry.replay.accesses()
                    finally:
                        self.graphs.dispatch.paused -= 1
            recording.op(f"{self.name}.replay: {entry.name} (captured at {_short(entry.site)})",
                         on, accesses, entry.kind, site=site)
        last = recording.detector.last_op(agent)
        self._last_end = None if last is None else (agent, last)

    def _replay_agent(self, captured: int, agent: int) -> int:
        """The capture stream's work replays on ``agent``; a forked stream's on one of the
        graph's own (program order across replays holds: launches of one graph are ordered)."""
        if captured == self._origin_agent:
            return agent
        recording = self.graphs.recording
        branch = recording.detector.agent_names[captured]
        return recording.agent(("graph branch", self.number, captured), f"{self.name}/{branch}")

    def _compute(self, values: Callable[[], object]) -> None:
        dispatch = self.graphs.dispatch
        dispatch.paused += 1
        try:
            with torch._C.DisableTorchFunction():
                values()
        finally:
            dispatch.paused -= 1

    def reset(self) -> None:
        """Drop the template and leave the pool (released once no graph uses it)."""
        self.template = None
        self._last_end = None
        if self.pool is not None:
            self.graphs.leave_pool(self.pool)
            self.pool = None


def _short(site: str) -> str:
    file, line = split_site(site)
    return f"{file.rsplit('/', 1)[-1]}:{line}" if line is not None else site
