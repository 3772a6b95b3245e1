"""The gpu-check page never presents the value replay's timing as the model's error.

The value replay issues every op through the harness, so its timing against the simulator is
the harness's own per-op overhead; the model's timing evidence is the timing replay
(docs/calibration.md). Checked on the newest committed suite report, rendered again.
"""

from __future__ import annotations

import json
from pathlib import Path

from overlap_harness.replay.report import render_markdown

ROOT = Path(__file__).resolve().parents[2]
REPORT = max((ROOT / "reports" / "gpu").glob("20*-h*00.json"))


def rendered() -> str:
    return render_markdown(json.loads(REPORT.read_text(encoding="utf-8")))


def test_value_replay_timing_is_labelled_as_overhead_and_points_at_calibration() -> None:
    (line,) = [ln for ln in rendered().splitlines() if "median |relative error|" in ln]
    assert "of the model:" not in line
    assert "the harness's own per-op overhead, not the model's error" in line
    assert line.endswith("docs/calibration.md") and (ROOT / "docs" / "calibration.md").is_file()


def test_committed_page_is_the_rendered_report() -> None:
    assert REPORT.with_suffix(".md").read_text(encoding="utf-8") == rendered()
