"""Sync sites hidden in small helpers (core/helper_sites.py), on a two-stream loop of this file
(no engine): the call of a function whose body is only syncs is a site of its own, found and
removed like a sync statement; a function that also computes is not a helper. Verdicts come
from the recorder: each necessary helper call races when removed, and the intact loop (its
fixed twin) is race-free."""

from __future__ import annotations

from pathlib import Path

import torch

from overlap_harness.engines.core.helper_sites import scan_files, sync_helpers
from overlap_harness.engines.core.necessity import MUTABLE_KINDS, necessity_table
from overlap_harness.engines.core.results import VariantOutcome, Verdict, race_record
from overlap_harness.engines.core.sites import SiteKind, scan
from overlap_harness.recorder import watch

THIS = str(Path(__file__).resolve())


def wait_for(consumer: torch.cuda.Stream, producer: torch.cuda.Stream) -> None:
    """Queue ``consumer``'s later work behind ``producer``'s queued work."""
    consumer.wait_stream(producer)


def record_each(tensors: tuple, stream: torch.cuda.Stream) -> None:
    """Keep each tensor's memory until ``stream``'s queued work is done."""
    for tensor in tensors:
        if tensor is not None:
            tensor.record_stream(stream)


def recorded_copy(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    """Not a helper: it computes too (removing its call would remove the copy)."""
    tensor.record_stream(stream)
    return tensor.clone()


class Pipeline:
    """The side stream doubles the main stream's input into ``out``, which the main stream
    sums; then the side triples a scratch tensor of the main stream, which the main stream
    drops without waiting. ``extra_fence`` repeats the side's wait; ``late`` is never true."""

    def __init__(self) -> None:
        self.side = torch.cuda.Stream()

    def _side_waits_main(self) -> None:
        self.side.wait_stream(torch.cuda.current_stream())

    def step(self, x: torch.Tensor, out: torch.Tensor, extra_fence: bool,
             late: bool = False) -> torch.Tensor:
        main = torch.cuda.current_stream()
        scratch = x + 1  # allocated on main, read on the side, dropped at return
        self._side_waits_main()
        if extra_fence:
            wait_for(self.side, main)
        with torch.cuda.stream(self.side):
            out.copy_(x * 2)
        wait_for(main, self.side)
        total = out.sum()
        if late:
            wait_for(main, self.side)
        with torch.cuda.stream(self.side):
            self.tripled = scratch * 3
        record_each((scratch, None), self.side)
        return total


def run(name: str) -> VariantOutcome:
    with watch("cpu") as w:
        pipeline = Pipeline()
        out = torch.zeros(4, device="cuda")
        for i in range(3):
            x = torch.full((4,), float(i), device="cuda")
            pipeline.step(x, out, extra_fence=name == "fenced")
    return VariantOutcome(name, [race_record(r, name) for r in w.races])


def test_helpers_are_functions_whose_body_is_only_syncs():
    found = {(h.qualname, h.kind) for h in sync_helpers([THIS], MUTABLE_KINDS)}
    assert found == {("wait_for", SiteKind.WAIT_STREAM),
                     ("record_each", SiteKind.RECORD_STREAM),
                     ("Pipeline._side_waits_main", SiteKind.WAIT_STREAM)}


def test_their_calls_are_sites_beside_the_plain_statements():
    sites = scan_files([THIS], MUTABLE_KINDS)
    calls = [(s.function, s.via, s.code) for s in sites if s.via]
    assert calls == [
        ("Pipeline.step", "Pipeline._side_waits_main", "self._side_waits_main()"),
        ("Pipeline.step", "wait_for", "wait_for(self.side, main)"),
        ("Pipeline.step", "wait_for", "wait_for(main, self.side)"),
        ("Pipeline.step", "wait_for", "wait_for(main, self.side)"),
        ("Pipeline.step", "record_each", "record_each((scratch, None), self.side)")]
    assert len(sites) == len(scan(THIS)) + len(calls)  # the helpers' own lines stay sites
    # the call of a function that computes is not a site: only its own statement is
    assert not any("recorded_copy(" in s.code for s in sites)


def test_removing_a_helper_call_removes_its_sync():
    variants = ["plain", "fenced"]
    baseline = {name: run(name) for name in variants}
    assert all(not outcome.races for outcome in baseline.values())  # the fixed twins
    sites = [s for s in scan_files([THIS], MUTABLE_KINDS) if s.function == "Pipeline.step"]
    rows = necessity_table(sites, variants, baseline, run, jobs=2)
    verdict = {(row.site.rsplit(":", 1)[1], row.variant): row for row in rows}
    line = {s.code: s.line for s in reversed(sites)}  # the first line of equal code
    forward = verdict[str(line["self._side_waits_main()"]), "plain"]
    assert forward.verdict == Verdict.NECESSARY
    assert "RAW" in {r["kind"] for r in forward.races}  # the side reads x unordered
    back = verdict[str(line["wait_for(main, self.side)"]), "plain"]
    assert back.verdict == Verdict.NECESSARY
    keep = verdict[str(line["record_each((scratch, None), self.side)"]), "plain"]
    assert keep.verdict == Verdict.NECESSARY
    assert {r["kind"] for r in keep.races} == {"reuse"}
    # the side's own wait is repeated by the fenced variant's helper call
    assert verdict[str(line["self._side_waits_main()"]), "fenced"].verdict == Verdict.REDUNDANT
    late = max(s.line for s in sites if s.code == "wait_for(main, self.side)")
    assert verdict[str(late), "plain"].verdict == Verdict.NOT_REACHED
