"""Capture a scenario run's calls as the timing replay's op list (:mod:`model.op_list`).

:class:`CaptureSimDevice` is a :class:`SimDevice` that, at each call of the public device API
the program makes, appends a :class:`model.op_list.ReplayCall` (kind, stream, event, cost,
copy size and direction, label, iteration) and then runs the call as the simulator does. A
call whose sync label the run removed is not issued by the program and is not captured.
Buffer allocations and frees are not captured: the replay allocates every buffer once
before it starts, and the simulator charges them nothing either.

It runs with no host cost (``host_launch_us=0``) and in issue-order values (the host's
control flow is the program's whatever the timing, ``sim.sim_device`` says why), so the list
is the program's, the same on every device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from overlap_harness.model.config import Scenario
from overlap_harness.model.device import (
    AccessSpec,
    Buffer,
    Event,
    OpFn,
    Sel,
    Stream,
    SyncLabel,
    norm_accesses,
)
from overlap_harness.model.op_list import ReplayCall
from overlap_harness.model.protocol import run_protocol
from overlap_harness.model.trace import OpRecord
from overlap_harness.sim.sim_device import SimDevice


def _key(event: Event) -> str:
    return f"{event.name}#{event.id}"


def _nbytes(buf: Buffer, sel: Sel) -> int:
    return int(buf.elements(sel).size) * buf.dtype.itemsize


class CaptureSimDevice(SimDevice):
    """A SimDevice that records the calls it is given in :attr:`calls` (module docstring)."""

    def __init__(self, removed: Iterable[SyncLabel | str] = (), **kwargs: Any) -> None:
        kwargs.setdefault("host_launch_us", 0.0)
        kwargs.setdefault("values", "issue_order")
        super().__init__(removed, **kwargs)
        self.calls: list[ReplayCall] = []

    def _kept(self, label: SyncLabel | None) -> bool:
        return label is None or SyncLabel(label) not in self.removed

    def _add(self, kind: str, name: str, label: SyncLabel | None = None, **fields: Any) -> None:
        self.calls.append(ReplayCall(kind, name, label=None if label is None else str(label),
                                     iteration=self.iteration, **fields))

    # -- work -----------------------------------------------------------------------------
    def launch(self, stream: Stream, name: str, fn: OpFn, reads: Sequence[AccessSpec] = (),
               writes: Sequence[AccessSpec] = (), cost_us: float = 0.0,
               observe: str | None = None) -> None:
        self._add("kernel", name, stream=stream.name, cost_us=cost_us)
        super().launch(stream, name, fn, reads, writes, cost_us, observe)

    def copy(self, stream: Stream, src: AccessSpec, dst: AccessSpec, *, non_blocking: bool,
             cost_us: float = 0.0, label: SyncLabel | None = None, name: str = "copy") -> None:
        ((src_buf, src_sel),) = norm_accesses([src])
        ((dst_buf, _),) = norm_accesses([dst])
        direction = "d2h" if dst_buf.pinned else "h2d" if src_buf.pinned else "d2d"
        self._add("copy", name, label, stream=stream.name, cost_us=cost_us,
                  nbytes=_nbytes(src_buf, src_sel), direction=direction,
                  blocking=not non_blocking and self._kept(label))
        super().copy(stream, src, dst, non_blocking=non_blocking, cost_us=cost_us,
                     label=label, name=name)

    def host_work(self, name: str, cost_us: float) -> None:
        self._add("host_work", name, cost_us=cost_us)
        super().host_work(name, cost_us)

    def host_read(self, buf: Buffer, sel: Sel = None, name: str = "host_read") -> torch.Tensor:
        self._add("host_read", name, nbytes=_nbytes(buf, sel))
        return super().host_read(buf, sel, name)

    def host_write(self, buf: Buffer, sel: Sel, value: Any, name: str = "host_write") -> None:
        self._add("host_write", name, nbytes=_nbytes(buf, sel))
        super().host_write(buf, sel, value, name)

    # -- sync -----------------------------------------------------------------------------
    def record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None = None) -> None:
        if self._kept(label):
            self._add("record_stream", f"record_stream:{buf.name}", label, stream=stream.name)
        super().record_stream(buf, stream, label)

    def record(self, event: Event, stream: Stream, label: SyncLabel | None = None) -> None:
        if self._kept(label):
            self._add("record", f"record:{event.name}", label, stream=stream.name,
                      event=_key(event))
        super().record(event, stream, label)

    def wait_event(self, stream: Stream, event: Event, label: SyncLabel | None = None) -> None:
        if self._kept(label):
            self._add("wait_event", f"wait:{event.name}", label, stream=stream.name,
                      event=_key(event))
        super().wait_event(stream, event, label)

    def wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None = None) -> None:
        if self._kept(label):
            self._add("wait_stream", f"wait:{other.name}", label, stream=waiter.name,
                      other=other.name)
        super().wait_stream(waiter, other, label)

    def synchronize(self, target: Stream | Event | None = None,
                    label: SyncLabel | None = None) -> None:
        if self._kept(label):
            if isinstance(target, Stream):
                self._add("synchronize", f"sync:{target.name}", label, stream=target.name,
                          other="stream")
            elif isinstance(target, Event):
                self._add("synchronize", f"sync:{target.name}", label, other="event",
                          event=_key(target))
            else:
                self._add("synchronize", "sync:device", label, other="device")
        super().synchronize(target, label)

    def query(self, event: Event, label: SyncLabel | None = None) -> bool:
        if self._kept(label):
            self._add("query", f"query:{event.name}", label, event=_key(event))
        return super().query(event, label)

    def poll(self, event: Event, label: SyncLabel | None = None) -> None:
        if self._kept(label):
            self._add("poll", f"poll:{event.name}", label, event=_key(event))
        super().poll(event, label)


def capture_op_list(scenario: Scenario, removed: Iterable[str] = (),
                    ) -> tuple[list[ReplayCall], list[OpRecord]]:
    """The op list of one run of ``scenario`` with ``removed`` syncs, and the simulator's
    timeline of that run (durations = the calls' costs, no host cost)."""
    dev = CaptureSimDevice(removed, jitter=0.0, seed=scenario.check.seed)
    run_protocol(dev, scenario)
    return dev.calls, dev.finish().timeline
