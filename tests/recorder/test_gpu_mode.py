"""GPU mode agrees with CPU mode: the same programs, the same races, on real streams.

Marked ``gpu`` (skipped without CUDA). Each racy/fixed pair of test_rules.py runs under
``watch("gpu")`` and ``watch("cpu")`` in one process; the summaries (kind, tensor, both ops
and streams) must be equal. A single ``query()`` answers False first in both modes. Every
corpus program (tests/recorder_corpus/) is also checked in both modes: the same races, at the
same sites.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from overlap_harness.recorder import check_script, watch
from tests.recorder.test_rules import PAIRS, summary

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

COMPARED = sorted(PAIRS)


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


CORPUS = Path(__file__).resolve().parents[1] / "recorder_corpus"
PROGRAMS = sorted(p.name for p in CORPUS.glob("*_racy.py")) + sorted(
    p.name for p in CORPUS.glob("*_fixed.py"))


def verdict(result) -> list[tuple[str, ...]]:
    """What must agree between the modes: the set of (kind, tensor, both sites with their
    ops). A pair of sites is one race however many iterations repeat it (GPU mode reported
    graph_decode_read_done's WAR pair three times where CPU mode did twice, H100 2026-11-25)."""
    return sorted({(str(r.kind), r.buffer, r.first.source, r.first.op_name, r.second.source,
                    r.second.op_name) for r in result.races})


@pytest.mark.parametrize("program", PROGRAMS)
def test_corpus_verdicts_agree_between_gpu_and_cpu_mode(program, capsys):
    gpu = check_script(CORPUS / program, mode="gpu")
    cpu = check_script(CORPUS / program, mode="cpu")
    capsys.readouterr()
    assert (gpu.error, cpu.error) == (None, None)
    assert verdict(gpu) == verdict(cpu)
    assert bool(gpu.races) == program.endswith("_racy.py")
