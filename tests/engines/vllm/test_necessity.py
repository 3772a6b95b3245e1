"""The sync-site scan and the necessity rows, on a small two-stream loop of this file (no vLLM
needed): a necessary sync races when removed, a redundant one does not, an unreached one is
reported as not reached."""

from __future__ import annotations

import torch

from overlap_harness.engines.vllm.necessity import lines_reached, row, sync_sites
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


def run(extra_fence: bool = False):
    with watch("cpu") as w:
        loop = Loop()
        x = torch.arange(4, device="cuda")
        staging = torch.zeros(4, dtype=x.dtype, pin_memory=True)
        for _ in range(2):
            loop.step(x, staging, extra_fence)
    return w


def test_the_scan_finds_every_sync_statement_with_its_line():
    codes = [site.code for site in sync_sites(Loop, "step")]
    assert codes == ["self.side.wait_stream(torch.cuda.current_stream())",
                     "self.done.record()", "self.done.synchronize()",
                     "self.side.synchronize()"]


def test_rows_say_necessary_redundant_and_not_reached():
    sites = {site.code: site for site in sync_sites(Loop, "step")}
    watcher, reached = lines_reached(lambda: run(extra_fence=False), [sites[
        "self.done.record()"].file])
    assert watcher.races == []
    necessary = row("plain", sites["self.done.synchronize()"], run, reached)
    assert necessary["real"] == "race" and necessary["pairs"][0]["kind"] == "host-D2H"
    unreached = row("plain", sites["self.side.synchronize()"], run, reached)
    assert unreached["real"] == "not_reached"
    _watcher, reached_fenced = lines_reached(lambda: run(extra_fence=True),
                                             [sites["self.done.record()"].file])
    redundant = row("fenced", sites["self.done.synchronize()"],
                    lambda: run(extra_fence=True), reached_fenced)
    assert redundant["real"] == "race_free" and redundant["races"] == 0
