"""The model follows the release: protocol keys an older SGLang release lacks the feature of.

SGLang 0.5.20 has no ``_reqs_finishing_inflight``: a request whose queued result finishes it
runs one decode more, and its row is freed while that decode may still read it. The real
loop (reports/conformance/sglang-0.5.20-loop.json) then races without the WAR barrier's wait
on the read-done event in ``idle_dp_rank``, where the row is given to the next request at
once, and stays race-free in ``non_spec_decode``, where SGLang's running batch still counts
the finished requests and admits no prefill until its next decode step filters them. Every
verdict below is the model's detector's, each racy case beside its fixed twin.
"""

from __future__ import annotations

import pytest

from overlap_harness.engines.sglang.release_features import Feature
from overlap_harness.engines.sglang.report import loop_report, model_protocol

READ_DONE_WAIT = ("war_barrier.read_done_wait",)
WITHOUT_SKIP = (("skip_finishing_decode", False),)


def test_a_release_lacking_the_feature_turns_its_key_off(monkeypatch):
    looked_up: list[Feature] = []

    def lacking(feature: Feature) -> str:
        looked_up.append(feature)
        return f"{feature.module} has no {feature.name}"

    monkeypatch.setattr(model_protocol, "lacks", lacking)
    assert model_protocol.release_protocol() == {"skip_finishing_decode": False}
    assert [f.name for f in looked_up] == ["Scheduler._reqs_finishing_inflight"]
    line, = model_protocol.described(model_protocol.release_protocol())
    assert "skip_finishing_decode = false" in line and "_reqs_finishing_inflight" in line


def test_a_release_with_every_feature_changes_nothing(monkeypatch):
    monkeypatch.setattr(model_protocol, "lacks", lambda feature: None)
    assert model_protocol.release_protocol() == {}


def test_without_the_skip_the_freed_row_races_in_the_dp_scenario():
    """idle_dp_rank: the finishing request's extra decode reads its row, the next request's
    prefill rewrites it at once; only the read-done wait orders them (0.5.20's real verdict).
    The twin: with the skip (0.5.22 on) there is no extra decode."""
    assert loop_report.model_verdict("idle_dp_rank", READ_DONE_WAIT, WITHOUT_SKIP) == "race"
    assert loop_report.model_verdict("idle_dp_rank", READ_DONE_WAIT) == "race_free"


@pytest.mark.parametrize("variant", ["non_spec_decode", "graph_decode"])
def test_the_running_batch_cap_holds_the_prefill_back(variant):
    """Two finished requests still counted in a running batch of at most two admit no
    prefill until the decode step filters them; by then the host has waited the extra
    decode's copy, so the row's reuse is ordered. Uncapped (more rows than the running batch
    may use) the same removal races."""
    uncapped = (*WITHOUT_SKIP, ("max_running_requests", 0))
    assert loop_report.model_verdict(variant, READ_DONE_WAIT, uncapped) == "race"
    assert loop_report.model_verdict(variant, READ_DONE_WAIT, WITHOUT_SKIP) == "race_free"
