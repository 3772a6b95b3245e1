"""ProfiledSimDevice: the simulated device charging a profile's per-call-kind costs.

``SimDevice`` charges one host cost (``host_launch_us``) for every stream op and nothing for
host reads, writes, allocations or the return from a host sync. A measured profile
(:mod:`model.profile`) gives a cost per call kind instead; this subclass charges them through
the public device API only: it advances the host clock (``host_ns``) before delegating, and
lengthens kernels and copies by the profile's extra duration. The base device runs with a
launch cost of 0, so every host cost comes from :class:`model.profile.ProfileCosts`.

A call whose sync label the run removed is not issued by the program, so it costs nothing.
Verdicts do not change: they depend on program order, never on these costs (README,
"Verdicts that do not depend on timing").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
from overlap_harness.model.profile import ProfileCosts
from overlap_harness.model.protocol import run_protocol
from overlap_harness.sim.sim_device import SimDevice, us_to_ns


class ProfiledSimDevice(SimDevice):
    """A SimDevice whose host and op costs come from ``costs`` (see the module docstring).

    Args:
        removed: sync labels to skip (a mutation).
        costs: the profile's costs (:func:`model.profile.costs_from_profile`).
        **kwargs: passed to :class:`SimDevice` (jitter, seed, delays, serial, values...).
    """

    def __init__(self, removed: Iterable[SyncLabel | str] = (), *, costs: ProfileCosts,
                 **kwargs: Any) -> None:
        kwargs["host_launch_us"] = 0.0
        super().__init__(removed, **kwargs)
        self.costs = costs
        self._issue_ns = {k: us_to_ns(v) for k, v in costs.host_issue_us.items()}
        self._return_ns = us_to_ns(costs.sync_return_us)
        self._span_ns = us_to_ns(costs.sync_span_us)
        self._wake_ns = us_to_ns(costs.sync_wake_us)
        self._copy_return_ns = self._return_ns if costs.copy_return_us is None \
            else us_to_ns(costs.copy_return_us)

    def _pay(self, kind: str, label: SyncLabel | None = None) -> None:
        """Advance the host clock by the issue cost of ``kind`` (unless the sync is removed)."""
        if label is None or SyncLabel(label) not in self.removed:
            self.host_ns += self._issue_ns.get(kind, 0)

    def _pay_op(self, kind: str, op_kind: str, name: str) -> None:
        """The op's own measured cost where the profile has it, else its kind's."""
        own = self.costs.op_issue_us.get(f"{op_kind}:{name}")
        self.host_ns += self._issue_ns.get(kind, 0) if own is None else us_to_ns(own)

    def _extra_us(self, op_kind: str, name: str) -> float:
        own = self.costs.op_extra_us.get(f"{op_kind}:{name}")
        return self.costs.extra_duration_us.get(op_kind, 0.0) if own is None else own

    def _returned(self) -> None:
        self.host_ns += self._return_ns

    def _host_wait(self, name: str, ops: list, done: int, label: SyncLabel | None) -> None:
        # The one private hook used: every host sync (synchronize, a blocking copy's wait)
        # blocks at least the sync's own cost, even when its work is already done, and one
        # that waited returns the host's wake-up time after the work's end.
        if done > self.host_ns:
            done += self._wake_ns
        super()._host_wait(name, ops, max(done, self.host_ns + self._span_ns), label)

    # -- resources ------------------------------------------------------------------------
    def buffer(self, name: str, shape: Sequence[int], dtype: torch.dtype, *,
               pinned: bool = False, fill: float | int | None = None,
               stream: Stream | None = None) -> Buffer:
        self._pay("alloc")
        return super().buffer(name, shape, dtype, pinned=pinned, fill=fill, stream=stream)

    def free(self, buf: Buffer) -> None:
        self._pay("free")
        super().free(buf)

    def record_stream(self, buf: Buffer, stream: Stream, label: SyncLabel | None = None) -> None:
        self._pay("record_stream", label)
        super().record_stream(buf, stream, label)

    # -- work -----------------------------------------------------------------------------
    def launch(self, stream: Stream, name: str, fn: OpFn, reads: Sequence[AccessSpec] = (),
               writes: Sequence[AccessSpec] = (), cost_us: float = 0.0,
               observe: str | None = None) -> None:
        self._pay_op("kernel", "kernel", name)
        super().launch(stream, name, fn, reads, writes,
                       cost_us + self._extra_us("kernel", name), observe)

    def copy(self, stream: Stream, src: AccessSpec, dst: AccessSpec, *, non_blocking: bool,
             cost_us: float = 0.0, label: SyncLabel | None = None, name: str = "copy") -> None:
        ((src_buf, _),) = norm_accesses([src])
        ((dst_buf, _),) = norm_accesses([dst])
        direction = "copy_d2h" if dst_buf.pinned else "copy_h2d" if src_buf.pinned \
            else "copy_d2d"
        self._pay_op(direction, "copy", name)
        measured = self.costs.copy_us.get(direction.removeprefix("copy_"))
        duration = cost_us + self._extra_us("copy", name) if measured is None else measured
        super().copy(stream, src, dst, non_blocking=non_blocking, cost_us=duration,
                     label=label, name=name)
        if not non_blocking and (label is None or SyncLabel(label) not in self.removed):
            self.host_ns += self._copy_return_ns

    def host_work(self, name: str, cost_us: float) -> None:
        self._pay("host_work")
        super().host_work(name, cost_us)

    def host_read(self, buf: Buffer, sel: Sel = None, name: str = "host_read") -> torch.Tensor:
        self._pay("host_read")
        return super().host_read(buf, sel, name)

    def host_write(self, buf: Buffer, sel: Sel, value: Any, name: str = "host_write") -> None:
        self._pay("host_write")
        super().host_write(buf, sel, value, name)

    # -- sync -----------------------------------------------------------------------------
    def record(self, event: Event, stream: Stream, label: SyncLabel | None = None) -> None:
        self._pay("record", label)
        super().record(event, stream, label)

    def wait_event(self, stream: Stream, event: Event, label: SyncLabel | None = None) -> None:
        self._pay("wait_event", label)
        super().wait_event(stream, event, label)

    def wait_stream(self, waiter: Stream, other: Stream, label: SyncLabel | None = None) -> None:
        self._pay("wait_stream", label)
        super().wait_stream(waiter, other, label)

    def synchronize(self, target: Stream | Event | None = None,
                    label: SyncLabel | None = None) -> None:
        self._pay("synchronize", label)
        super().synchronize(target, label)
        if label is None or SyncLabel(label) not in self.removed:
            self._returned()

    def query(self, event: Event, label: SyncLabel | None = None) -> bool:
        self._pay("query", label)
        return super().query(event, label)

    def poll(self, event: Event, label: SyncLabel | None = None) -> None:
        self._pay("query", label)
        super().poll(event, label)
        if label is None or SyncLabel(label) not in self.removed:
            self._returned()


def simulate_profiled(scenario: Scenario, removed: Iterable[str], costs: ProfileCosts,
                      delays: Mapping[tuple[str, int], float] | None = None,
                      values: str = "timed") -> tuple[Any, ProfiledSimDevice]:
    """One overlapped run of ``scenario`` (no jitter) on a :class:`ProfiledSimDevice`;
    returns (outcome, device). The scenario's Timing should be ``costs.timing``."""
    dev = ProfiledSimDevice(removed, costs=costs, jitter=0.0, seed=scenario.check.seed,
                            delays=delays, values=values)
    return run_protocol(dev, scenario), dev


def start_gap_delays(ops: Iterable[tuple[str, int]], gap_us: float,
                     delays: Mapping[tuple[str, int], float] | None = None,
                     ) -> dict[tuple[str, int], float]:
    """``delays`` with a GPU start gap for every (op name, iteration) of ``ops`` (kernels and
    copies of the run): the simulator's documented way to start an op later than its stream
    and inputs allow. A key already there keeps the larger of the two."""
    out = dict(delays or {})
    for key in set(ops):
        out[key] = max(out.get(key, 0.0), gap_us)
    return out
