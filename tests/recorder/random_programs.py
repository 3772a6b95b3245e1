"""Random ``torch.cuda`` programs, for holding the recorder's GPU mode to its CPU mode.

A program is a list of :class:`Step`: device kernels, index reads and writes, copies between
device and pinned or pageable host memory (blocking and not), host reads and writes of pinned
memory, events, waits, host syncs, single queries, ops whose output size depends on device
values, a scratch tensor freed and allocated again, and a CUDA graph (captured once,
replayed on any stream, its static input written and its output read). :func:`run_steps`
plays one on three streams under ``recorder.watch(mode)``; :func:`race_keys` is what the two
modes must agree on (kind, tensor variable, and both accesses' op and stream).
Happens-before does not depend on timing, so a program's race set is the same on real
streams and on the faked ones: a difference is a recorder bug
(``tools/recorder_mode_fuzz.py`` looks for one on a GPU and shrinks it). Every tensor is
allocated on its own line, so races name distinct variables.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from overlap_harness.recorder import watch

WIDTH = 64
STREAM_OPS = ("fill", "add_row", "index_write", "index_read", "sum", "h2d", "h2d_to", "d2h",
              "item", "tensor_from_list", "record", "wait_event", "wait_stream", "nonzero",
              "mask_index", "to_cpu_nonblocking", "scratch", "stream_sync",
              "pageable_d2h_nonblocking", "pageable_h2d_nonblocking", "cpu_copy",
              "scratch_record_stream", "stream_query", "graph_replay", "graph_input_write",
              "graph_output_read")
HOST_OPS = ("host_fill", "host_slice_write", "host_read", "host_tolist", "event_sync",
            "device_sync", "query", "scratch_free")
ACTIONS = STREAM_OPS + HOST_OPS


@dataclass(frozen=True, slots=True)
class Step:
    """One action: ``stream`` (0 default, 1-2 side streams) for stream ops, ``device`` and
    ``host`` pick a device and a pinned buffer (0-1), ``event`` an event (0-1), ``flag`` a
    copy's non_blocking (or the other stream of a wait), ``row`` a row (0-3)."""

    action: str
    stream: int
    device: int
    host: int
    event: int
    flag: bool
    row: int

    def __str__(self) -> str:
        return (f"{self.action}(stream={self.stream}, device={self.device}, host={self.host}, "
                f"event={self.event}, flag={self.flag}, row={self.row})")


def random_program(seed: int, length: int = 10) -> list[Step]:
    """A program of ``length`` steps drawn from ``seed`` (the same steps for the same seed)."""
    draw = random.Random(seed)
    return [Step(draw.choice(ACTIONS), draw.randrange(3), draw.randrange(2), draw.randrange(2),
                 draw.randrange(2), draw.random() < 0.5, draw.randrange(4))
            for _ in range(length)]


class _Program:
    """The tensors, streams and events one run of a program uses."""

    def __init__(self) -> None:
        self.side_one = torch.cuda.Stream()
        self.side_two = torch.cuda.Stream()
        self.streams = [torch.cuda.current_stream(), self.side_one, self.side_two]
        self.event_one = torch.cuda.Event()
        self.event_two = torch.cuda.Event()
        self.events = [self.event_one, self.event_two]
        self.dev_a = torch.zeros(4, WIDTH, device="cuda")
        self.dev_b = torch.zeros(4, WIDTH, device="cuda")
        self.devices = [self.dev_a, self.dev_b]
        self.pin_a = torch.zeros(4, WIDTH).pin_memory()
        self.pin_b = torch.zeros(4, WIDTH).pin_memory()
        self.hosts = [self.pin_a, self.pin_b]
        self.rows = torch.tensor([1, 2], device="cuda")
        self.mask = torch.tensor([True, False, True, False], device="cuda")
        self.ones = torch.ones(2, WIDTH, device="cuda")
        self.kept: list[torch.Tensor] = []
        self.scratch: torch.Tensor | None = None
        self.graph_in = torch.zeros(WIDTH, device="cuda")
        self.graph_out = torch.zeros(WIDTH, device="cuda")
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # captured: runs only at each replay
            self.graph_out.copy_(self.graph_in * 2.0)
        for stream in self.streams[1:]:  # the setup is done before any side stream runs
            stream.wait_stream(self.streams[0])

    def play(self, step: Step) -> None:
        if step.action in HOST_OPS:
            self._host(step)
        else:
            with torch.cuda.stream(self.streams[step.stream]):
                self._on_stream(step)

    def _host(self, step: Step) -> None:
        host, event = self.hosts[step.host], self.events[step.event]
        if step.action == "host_fill":
            host.fill_(float(step.row))
        elif step.action == "host_slice_write":
            host[step.row] = torch.full((WIDTH,), 2.0)
        elif step.action == "host_read":
            self.kept.append(host.sum())
        elif step.action == "host_tolist":
            host[step.row].tolist()
        elif step.action == "event_sync":
            event.synchronize()
        elif step.action == "device_sync":
            torch.cuda.synchronize()
        elif step.action == "query":
            event.query()
        elif step.action == "scratch_free":
            self.scratch = None

    def _on_stream(self, step: Step) -> None:
        device, host = self.devices[step.device], self.hosts[step.host]
        stream, event = self.streams[step.stream], self.events[step.event]
        action = step.action
        if action == "fill":
            device.fill_(float(step.row))
        elif action == "add_row":
            device[step.row] += 1
        elif action == "index_write":
            device.index_copy_(0, self.rows, self.ones)
        elif action == "index_read":
            self.kept.append(device.index_select(0, self.rows))
        elif action == "sum":
            self.kept.append(device.sum())
        elif action == "h2d":
            device.copy_(host, non_blocking=step.flag)
        elif action == "h2d_to":
            self.kept.append(host.to("cuda", non_blocking=step.flag))
        elif action == "d2h":
            host.copy_(device, non_blocking=step.flag)
        elif action == "item":
            device[step.row, 0].item()
        elif action == "tensor_from_list":
            self.kept.append(torch.tensor([step.row, 1], device="cuda"))
        elif action == "record":
            event.record(stream)
        elif action == "wait_event":
            stream.wait_event(event)
        elif action == "wait_stream":
            stream.wait_stream(self.streams[(step.stream + 1 + step.flag) % 3])
        elif action == "nonzero":
            self.kept.append(device[:, 0].nonzero())
        elif action == "mask_index":
            self.kept.append(device[self.mask])
        elif action == "to_cpu_nonblocking":  # then read on the host at once
            self.kept.append(device.to("cpu", non_blocking=True).sum())
        elif action == "scratch":
            self.scratch = None  # the last scratch block goes back to the pool
            self.scratch = torch.empty(WIDTH, device="cuda")
            self.scratch.fill_(1.0)
        elif action == "stream_sync":
            stream.synchronize()
        elif action == "pageable_d2h_nonblocking":  # then read on the host at once
            pageable = torch.zeros(4, WIDTH)
            pageable.copy_(device, non_blocking=True)
            self.kept.append(pageable.sum())
        elif action == "pageable_h2d_nonblocking":
            device.copy_(torch.full((4, WIDTH), 3.0), non_blocking=True)
        elif action == "cpu_copy":
            self.kept.append(device.cpu())
        elif action == "scratch_record_stream":
            if self.scratch is not None:
                self.scratch.add_(1.0)
                self.scratch.record_stream(stream)
        elif action == "stream_query":
            stream.query()
        elif action == "graph_replay":
            self.graph.replay()
        elif action == "graph_input_write":
            self.graph_in.fill_(float(step.row))
        elif action == "graph_output_read":
            self.kept.append(self.graph_out.sum())


def run_steps(steps: list[Step], mode: str) -> list[tuple[str, str, str, str]]:
    """The race keys of ``steps`` run under ``watch(mode)``."""
    with watch(mode) as watcher:
        program = _Program()
        for step in steps:
            program.play(step)
        torch.cuda.synchronize()  # after every access: orders nothing the verdict checks
    return race_keys(watcher.races)


def race_keys(races: list) -> list[tuple[str, str, str, str]]:
    """What both modes must agree on: kind, variable, and each access's op and stream."""
    return sorted({(str(r.kind), r.buffer.split("@")[0], f"{r.first.op_name}@{r.first.agent}",
                    f"{r.second.op_name}@{r.second.agent}") for r in races})
