"""CPU mode: the device-generic stream API (``torch.Event``, ``torch.accelerator``), device
(UVA) views of pinned memory read by kernels, and host accesses through NumPy views of pinned
memory. Each racy program has a fixed twin; every verdict is the detector's."""

from __future__ import annotations

import numpy as np
import torch

from overlap_harness.model.trace import RaceKind
from overlap_harness.recorder import watch

ORIGINAL_EVENT = torch.Event


def race_kinds(watcher) -> list[tuple[str, str]]:
    return sorted((str(r.kind), r.buffer.split("@")[0]) for r in watcher.races)


def _generic_event_handoff(synchronize: bool) -> list:
    """A D2H on a side stream, fenced by a device-generic event (or not), then a host read."""
    with watch("cpu") as w:
        side = torch.cuda.Stream()
        done = torch.Event()
        x = torch.arange(8, device="cuda")
        staging = torch.empty(8, dtype=x.dtype, pin_memory=True)
        side.wait_stream(torch.accelerator.current_stream())
        with torch.cuda.stream(side):
            staging.copy_(x, non_blocking=True)
            done.record()
        if synchronize:
            done.synchronize()
        staging.tolist()
    return race_kinds(w)


def test_device_generic_event_orders_like_a_cuda_event():
    assert _generic_event_handoff(synchronize=False) == [(str(RaceKind.HOST_D2H), "staging")]
    assert _generic_event_handoff(synchronize=True) == []
    assert torch.Event is ORIGINAL_EVENT


def _accelerator_sync(sync: bool) -> list:
    with watch("cpu") as w:
        x = torch.arange(8, device="cuda")
        staging = torch.empty(8, dtype=x.dtype, pin_memory=True)
        staging.copy_(x, non_blocking=True)
        if sync:
            torch.accelerator.synchronize()
        staging.tolist()
    return race_kinds(w)


def test_accelerator_synchronize_is_a_device_sync():
    assert _accelerator_sync(sync=False) == [(str(RaceKind.HOST_D2H), "staging")]
    assert _accelerator_sync(sync=True) == []


def test_current_stream_with_a_device_argument_and_set_stream():
    with watch("cpu"):
        side = torch.cuda.Stream()
        torch.cuda.set_stream(side)
        assert torch.cuda.current_stream(torch.device("cuda", 0)) is side
        assert torch.accelerator.current_stream() is side
        torch.accelerator.set_stream(torch.cuda.default_stream())
        assert torch.cuda.current_stream() == torch.cuda.default_stream()
        generic = torch.Event(torch.device("cuda"), enable_timing=True)
        generic.record()
        assert generic.query() is False  # the first probe: the outcome that orders nothing


def _uva_ring(depth: int, steps: int, fenced: bool) -> list:
    """Each step the host fills one pinned ring slot and a kernel on a side stream reads it
    through its device (UVA) view. Two steps are in flight: after launching step s the host
    waits only for step s-1, so a ring of depth 1 rewrites a slot step s may still read,
    unless ``fenced`` (the host waits for the step that last read the slot)."""
    with watch("cpu") as w:
        compute = torch.cuda.Stream()
        slots = [torch.zeros(4, dtype=torch.int32, pin_memory=True) for _ in range(depth)]
        views = [w.device_view(slot) for slot in slots]
        host_views = [slot.numpy() for slot in slots]
        out = torch.zeros(4, dtype=torch.int32, device="cuda")
        compute.wait_stream(torch.cuda.current_stream())  # ``out`` is zeroed before use
        step_done = []
        for step in range(steps):
            slot = step % depth
            if fenced and step >= depth:
                step_done[step - depth].synchronize()
            host_views[slot][:] = step  # the host rewrites the slot
            with torch.cuda.stream(compute):
                out.add_(views[slot])  # the kernel reads pinned memory through the view
                step_done.append(torch.cuda.Event())
                step_done[-1].record()
            if step >= 1:
                step_done[step - 1].synchronize()  # the step before this one is retired
    return race_kinds(w)


def test_uva_ring_deep_enough_for_the_steps_in_flight_is_race_free():
    assert _uva_ring(depth=2, steps=6, fenced=False) == []
    assert _uva_ring(depth=3, steps=6, fenced=False) == []


def test_uva_ring_shallower_than_the_steps_in_flight_races():
    races = _uva_ring(depth=1, steps=4, fenced=False)
    assert races and set(races) == {(str(RaceKind.WAR), "slots")}


def test_uva_ring_too_shallow_but_fenced_is_race_free():
    assert _uva_ring(depth=1, steps=4, fenced=True) == []


def test_a_device_view_looks_like_cuda_and_its_copies_are_device_work():
    with watch("cpu") as w:
        pinned = torch.arange(6, dtype=torch.int64).pin_memory()
        view = w.device_view(pinned)
        part = view[2:4]
        assert view.is_cuda and part.is_cuda and view.device.type == "cuda"
        assert not view.is_pinned() and pinned.is_pinned() and not pinned.is_cuda
        copied = part.clone()  # a kernel on the current stream, reading the pinned memory
        assert copied.is_cuda and copied.tolist() == [2, 3]
        host = pinned.numpy()
        host[2] = 7  # races nothing: the clone's result was read back (a host sync) above
    assert w.races == []


def test_numpy_views_of_pinned_memory_record_exact_host_accesses():
    def run(wait: bool) -> list:
        with watch("cpu") as w:
            x = torch.arange(8, device="cuda")
            staging = torch.zeros(8, dtype=x.dtype, pin_memory=True)
            host = staging.numpy()
            staging[4:].copy_(x[4:], non_blocking=True)
            if wait:
                torch.cuda.current_stream().synchronize()
            untouched = int(host[1])  # elements the copy does not write: no race
            seen = host[4:6].tolist()
            np.add(host[:2], 1, out=host[:2])
        assert untouched == 0 and isinstance(seen, list)
        return race_kinds(w)

    assert run(wait=False) == [(str(RaceKind.HOST_D2H), "staging")]
    assert run(wait=True) == []


def test_numpy_fill_and_in_place_arithmetic_are_host_writes():
    def run(wait: bool) -> list:
        with watch("cpu") as w:
            staging = torch.zeros(6, dtype=torch.int64, pin_memory=True)
            device = torch.zeros(6, dtype=torch.int64, device="cuda")
            host = staging.numpy()
            device.copy_(staging, non_blocking=True)  # the stream reads the whole buffer
            if wait:
                torch.cuda.current_stream().synchronize()
            host[3:].fill(1)
            host[:3] += 2
        return race_kinds(w)

    racy = run(wait=False)  # fill, and += (its ufunc write and Python's item assignment)
    assert set(racy) == {(str(RaceKind.HOST_D2H), "staging")} and len(racy) >= 2
    assert run(wait=True) == []


def test_numpy_writes_after_the_watch_record_nothing():
    with watch("cpu") as w:
        staging = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        host = staging.numpy()
    ops = w.recording.ops_recorded
    host[:] = 3
    assert w.recording.ops_recorded == ops and staging.tolist() == [3, 3, 3, 3]
