"""The core's scan of one live function and its necessity table, on a small two-stream loop of
this file (no engine needed): a necessary sync races when removed, a redundant one does not,
an unreached one is reported as not reached. Verdicts come from the recorder."""

from __future__ import annotations

import os

import torch

from overlap_harness.engines.core.necessity import MUTABLE_KINDS, necessity_table
from overlap_harness.engines.core.results import VariantOutcome, Verdict, race_record
from overlap_harness.engines.core.sites import SiteKind, function_sites
from overlap_harness.recorder import watch


class Loop:
    """Side-stream producer, host consumer; ``extra_fence`` repeats the fence."""

    def __init__(self) -> None:
        self.side = torch.cuda.Stream()
        self.done = torch.cuda.Event()

    def step(self, x: torch.Tensor, staging: torch.Tensor, extra_fence: bool) -> list:
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            staging.copy_(x, non_blocking=True)
            self.done.record()
        self.done.synchronize()
        if extra_fence:
            self.side.synchronize()
        return staging.tolist()


def run(name: str) -> VariantOutcome:
    with watch("cpu") as w:
        loop = Loop()
        x = torch.arange(4, device="cuda")
        staging = torch.zeros(4, dtype=x.dtype, pin_memory=True)
        for _ in range(2):
            loop.step(x, staging, extra_fence=name == "fenced")
    return VariantOutcome(name, [race_record(r, name) for r in w.races])


def test_the_scan_of_one_function_finds_every_sync_statement_with_its_line():
    found = [(site.kind, site.code) for site in function_sites(Loop, "step")]
    assert found == [(SiteKind.WAIT_STREAM, "self.side.wait_stream(torch.cuda.current_stream())"),
                     (SiteKind.NON_BLOCKING_COPY, "staging.copy_(x, non_blocking=True)"),
                     (SiteKind.EVENT_RECORD, "self.done.record()"),
                     (SiteKind.SYNCHRONIZE, "self.done.synchronize()"),
                     (SiteKind.SYNCHRONIZE, "self.side.synchronize()")]
    assert all(site.function == "Loop.step" for site in function_sites(Loop, "step"))


def test_rows_say_necessary_redundant_and_not_reached():
    variants = ["plain", "fenced"]
    baseline = {name: run(name) for name in variants}
    assert all(not outcome.races for outcome in baseline.values())
    sites = function_sites(Loop, "step")
    rows = necessity_table(sites, variants, baseline, run, jobs=2)
    assert len(rows) == len([s for s in sites if s.kind in MUTABLE_KINDS]) * 2
    verdict = {(row.code, row.variant): row for row in rows}
    necessary = verdict["self.done.synchronize()", "plain"]
    assert necessary.verdict == Verdict.NECESSARY
    assert necessary.races[0]["kind"] == "host-D2H"
    assert verdict["self.side.synchronize()", "plain"].verdict == Verdict.NOT_REACHED
    assert verdict["self.done.synchronize()", "fenced"].verdict == Verdict.REDUNDANT
    assert verdict["self.side.synchronize()", "fenced"].verdict == Verdict.REDUNDANT


def test_a_variant_that_crashes_in_the_children_is_an_error_not_unreached():
    """The intact run passes in this process; the mutated runs (forked children) crash
    before any site: each of their rows says error with the crash, none not reached."""
    parent = os.getpid()

    def run_here_only(name: str) -> VariantOutcome:
        if os.getpid() != parent:
            return VariantOutcome(name, [], error="RuntimeError: stale state in the child")
        return run("plain")

    baseline = {"plain": run_here_only("plain")}
    rows = necessity_table(function_sites(Loop, "step"), ["plain"], baseline, run_here_only)
    assert rows and {row.verdict for row in rows} == {Verdict.ERROR}
    assert all("stale state" in row.error for row in rows)
