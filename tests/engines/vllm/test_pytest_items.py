"""vLLM's variants as pytest items (the core's items, vLLM's thin plugin): nothing without the
flag; with it, one item per variant and per variant x removable sync site, verdicts in the
JUnit properties, spread over pytest-xdist workers. Skipped where vLLM is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from overlap_harness.engines.core.mutation import site
from overlap_harness.engines.vllm import necessity

ROOT = Path(__file__).resolve().parents[3]


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_plain.py").write_text("def test_plain():\n    assert 2 + 2 == 4\n")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "overlap_harness.engines.vllm.pytest_items", *args, "-q",
                           "test_plain.py"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600,
                          check=False)


@pytest.mark.engine_run
def test_nothing_is_collected_without_the_flag(tmp_path):
    done = _pytest(tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout


@pytest.mark.engine_run
def test_one_item_per_variant_and_site_with_its_verdict_across_xdist_workers(tmp_path):
    done = _pytest(tmp_path, "--vllm-async", "--vllm-variant", "v1-input-prep", "-n", "2",
                   "--junitxml", str(tmp_path / "junit.xml"))
    assert done.returncode == 0, done.stdout[-3000:]
    cases = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(tmp_path / "junit.xml").iter("testcase")}
    removable = [s for s in necessity.sites() if s.kind in necessity.MUTABLE_KINDS]
    assert len(cases) == 1 + 1 + len(removable)  # test_plain, the variant, its sites
    fence = site(GPUModelRunner, "synchronize_input_prep", "prepare_inputs_event.synchronize()")
    assert cases[f"v1-input-prep[gpu_model_runner.py:{fence.line}]"]["verdict"] == "necessary"
    others = [s for s in removable if s.function != "GPUModelRunner.synchronize_input_prep"]
    assert all(cases[f"v1-input-prep[{s.key}]"]["verdict"] == "not_reached" for s in others)
