"""The model's counterpart of SGLang's decode CUDA-graph read-done records (no SGLang needed).

``decode_read_done`` (off by default: ``after_reads``) records the read-done event as
SGLang 0.5.23's decode graph runner does: inside the replay (``in_graph``) or after it
(``post_replay``, the in-graph one recorded and unused), each record with its label, so the
loop report can remove decode_cuda_graph_runner.py's lines 670 and 696 one at a time. The
verdicts are the simulator's; each removal's fixed twin is the intact scenario.
"""

from __future__ import annotations

import pytest

from overlap_harness.engines.sglang.report import loop_report
from overlap_harness.runner import run_spec
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_scenario

IN_GRAPH = ("read_done.record_in_graph",)
POST_REPLAY = ("read_done.record_post_replay",)
BARRIER_WAIT = ("war_barrier.read_done_wait",)


@pytest.mark.parametrize("variant", ["graph_decode", "graph_decode_radix",
                                     "graph_decode_post_replay"])
def test_the_graph_scenarios_are_race_free_intact(variant):
    """The fixed twin of every removal below: the scenario with all its syncs."""
    path = loop_report.MODEL_SCENARIOS / f"sglang_loop_{variant}.toml"
    base = next(run for run in expand(load_scenario(path)) if not run.mutation_name)
    assert run_spec(base).verdict == "race_free"


@pytest.mark.parametrize(("variant", "labels", "verdict"), [
    ("graph_decode_radix", IN_GRAPH, "race"),  # the event waited on is never recorded
    ("graph_decode_radix", BARRIER_WAIT, "race"),
    ("graph_decode", IN_GRAPH, "race_free"),  # no rewrite of a row the graph reads
    ("graph_decode_post_replay", POST_REPLAY, "race"),
    ("graph_decode_post_replay", IN_GRAPH, "race_free"),  # recorded, never published
])
def test_removing_a_read_done_record_is_removing_the_wait_on_it(variant, labels, verdict):
    assert loop_report.model_verdict(variant, labels) == verdict


@pytest.mark.parametrize("variant", ["non_spec_decode", "radix_cache"])
def test_the_published_scenarios_never_reach_the_graph_records(variant):
    """Off by default: the existing loop scenarios record as before, unlabelled."""
    assert loop_report.model_verdict(variant, IN_GRAPH + POST_REPLAY) == "not_modelled"
