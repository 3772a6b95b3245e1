"""The configurations of issue 41 as a user asks for them with ``--config``, on the installed
SGLang: EAGLE (topk 1 and 4) with the plan stream off (SGLang's default) and backends that need
host sequence lengths (FlashInfer), and DSpark with backends that need none.

Each is the command a user runs; its exit status and races are the detector's. DSpark's relay
races as released there (docs/findings.md); its fixed twin is in
test_sglang_confidence_relay.py (the same variant with the scatter waiting for the last ring
copy: race-free).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.sglang_trees import run_sglang


@pytest.mark.engine_run
def test_eagle_with_host_lengths_and_the_plan_stream_off_runs_race_free(tmp_path):
    status, output, document = run_sglang(
        "--config", "speculative=eagle", "--config", "plan_stream=off", "--config",
        "cpu_seq_lens=on", json_path=tmp_path / "races.json", timeout=900)
    assert status == 0, output
    assert set(document["variants"]) == {"eagle_d2h_stream_plan_off",
                                         "eagle_topk4_d2h_stream_plan_off"}
    assert {document["configurations"][v]["eagle_topk"] for v in document["variants"]} == {
        "1", "4"}
    assert document["races"] == []


@pytest.mark.engine_run
def test_dspark_without_host_lengths_reports_the_relay_race(tmp_path):
    status, output, document = run_sglang(
        "--config", "speculative=dspark", "--config", "cpu_seq_lens=off",
        json_path=tmp_path / "races.json", timeout=900)
    assert status == 1, output
    assert document["variants"] == ["dspark_no_host_lengths"]
    races = document["races"]
    assert races
    for race in races:
        assert race["kind"] == "WAR" and "confidence_buf" in race["tensor"], race
        sides = (race["first"], race["second"])
        assert {Path(s["file"]).name for s in sides} == {"overlap_utils.py"}, race
        assert {s["stream"] for s in sides} == {"self.fwd_prepare_d2h_stream",
                                                "self.forward_stream"}, race
