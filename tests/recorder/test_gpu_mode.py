"""GPU mode agrees with CPU mode: the same programs, the same races, on real streams.

Marked ``gpu`` (skipped without CUDA). Each racy/fixed pair of test_rules.py runs under
``watch("gpu")`` and ``watch("cpu")`` in one process; the summaries (kind, tensor, both ops
and streams) must be equal. The query pair is left out: on a GPU a single ``query()`` answers
what the device says, CPU mode answers False first (recorder/core.py).
"""

from __future__ import annotations

import pytest
import torch

from recorder import watch
from tests.recorder.test_rules import PAIRS, summary

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

COMPARED = sorted(name for name in PAIRS if name != "single_query_vs_poll")


def gpu_summary(program, fixed: bool) -> list[tuple[str, ...]]:
    with watch("gpu") as watcher:
        program(fixed)
        torch.cuda.synchronize()
    return sorted((str(r.kind), r.buffer.split("@")[0], f"{r.first.op_name}@{r.first.agent}",
                   f"{r.second.op_name}@{r.second.agent}") for r in watcher.races)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("name", COMPARED)
def test_gpu_verdict_equals_cpu_verdict(name, fixed):
    program, _ = PAIRS[name]
    assert gpu_summary(program, fixed) == summary(program, fixed)


def test_gpu_mode_sees_real_cuda_tensors_and_undoes_its_hooks():
    original_query = torch.cuda.Event.query
    with watch("gpu") as watcher:
        x = torch.ones(4, device="cuda")
        x.add_(1)
    assert torch.cuda.Event.query is original_query
    assert [n.name for n in watcher.recording.detector.nodes] == ["ones", "add_"]
    assert x.is_cuda and x.sum().item() == 8.0
