"""GPU mode of SGLang's loop on a CUDA device: the unmodified loop equals the serial answer
under each stream's delay, and a necessary site removed with its race forced does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "reports" / "conformance" / "sglang-0.5.23-loop.json"


def _site_rows(site: str | None, variant: str, tmp_path: Path) -> list[dict]:
    """Run gpu_table's child for one site (None: unmodified) and one variant."""
    from overlap_harness.engines.sglang.gpu import table as gpu_table

    plan = gpu_table.plan(json.loads(LOOP.read_text()), [variant])
    spec, out = tmp_path / "spec.json", tmp_path / "out.json"
    spec.write_text(json.dumps({"site": site, "rows": plan[site]}))
    done = subprocess.run([sys.executable, "-m", "overlap_harness.engines.sglang.gpu.table",
                           str(spec), str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.engine_run
def test_unmodified_loop_equals_the_serial_answer_under_every_delay(tmp_path: Path) -> None:
    pytest.importorskip("sglang")
    [row] = _site_rows(None, "non_spec_decode", tmp_path)
    assert row["trials"] >= 4 and row["wrong_trials"] == 0, row


@pytest.mark.engine_run
def test_removed_result_copy_event_gives_a_wrong_token(tmp_path: Path) -> None:
    pytest.importorskip("sglang")
    [row] = _site_rows("sglang/srt/managers/utils.py:231", "non_spec_decode", tmp_path)
    assert row["cpu_verdict"] == "race"
    assert row["wrong_trials"] >= 1, row
    assert "serial" in row["example_wrong"]
