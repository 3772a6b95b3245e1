"""``overlap-harness vllm --vllm-src HEAD --base BASE`` on twins of the installed vLLM (every
file a link, the edited file a real copy): the async output's copy-stream wait removed races
and is named as the change (exit 1); the intact tree against that base lists the base's races
as fixed (exit 0). Verdicts are the detector's and coverage.py's. Slow: each case runs both
trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

pytestmark = pytest.mark.slow

try:
    INFO = import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
WAIT = "async_output_copy_stream.wait_stream(default_stream)"
VARIANT = "v1-async-output"


def _twin(tmp_path: Path, name: str, without_wait: bool) -> tuple[Path, int]:
    tree = tmp_path / name
    tree.mkdir()
    subprocess.run(["cp", "-rs", INFO.location, str(tree / "vllm")], check=True)
    runner = tree / RUNNER
    lines = runner.read_text().splitlines(keepends=True)
    index = next(i for i, line in enumerate(lines) if line.strip() == WAIT)
    if without_wait:
        del lines[index]
    runner.unlink()
    runner.write_text("".join(lines))
    return tree, index


def _view(head: Path, base: Path, tmp_path: Path) -> tuple[int, str, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "vllm", "--vllm-src",
                           str(head), "--base", str(base), "--variant", VARIANT, "-j", "2",
                           "--json", str(tmp_path / "pr.json")], capture_output=True,
                          text=True, env=env, timeout=900, check=False)
    return (done.returncode, done.stdout + done.stderr,
            json.loads((tmp_path / "pr.json").read_text()))


@pytest.mark.engine_run
def test_a_removed_copy_stream_wait_races_and_is_named(tmp_path: Path) -> None:
    head, index = _twin(tmp_path, "head", without_wait=True)
    base, _ = _twin(tmp_path, "base", without_wait=False)
    status, output, document = _view(head, base, tmp_path)
    assert status == 1, output
    changes = {r["change"] for r in document["races"]}
    assert changes == {f"{RUNNER}:{index + 1}"}, changes  # the statement after the removal
    assert all(WAIT in r["what"] for r in document["races"])
    assert document["changes"][0]["reached_by"] == [VARIANT]


@pytest.mark.engine_run
def test_restoring_the_wait_fixes_the_base_races(tmp_path: Path) -> None:
    head, _ = _twin(tmp_path, "head", without_wait=False)
    base, _ = _twin(tmp_path, "base", without_wait=True)
    status, output, document = _view(head, base, tmp_path)
    assert status == 0, output
    assert document["races"] == [] and document["races_fixed"]
