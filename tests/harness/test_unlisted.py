"""Scenarios nobody listed: random well-formed combinations of the scenario keys.

Two properties, computed on every drawn scenario:
1. with every sync in place, a correct protocol variant is race-free, fault-free and equal to
   its serial oracle, value by value;
2. with one sync the run used removed, any value that differs from the oracle is explained
   by a race the detector found (no silent corruption).
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlap_harness.model.config import (
    EventKind,
    Expect,
    Gather,
    Mode,
    ProtocolConfig,
    PublishPoint,
    Request,
    Scenario,
    SeqLensD2H,
    Timing,
    WarBarrier,
    Workload,
    WorkloadEvent,
)
from overlap_harness.runner import run_spec
from overlap_harness.scenarios.expand import RunSpec


@st.composite
def protocols(draw) -> ProtocolConfig:
    mode = draw(st.sampled_from([Mode.SPEC_V2, Mode.NON_SPEC]))
    barrier = draw(st.sampled_from([WarBarrier.LOOP_TOP, WarBarrier.READ_DONE,
                                    WarBarrier.AFTER_LAUNCH]))
    steps = draw(st.integers(1, 4))
    topk = draw(st.sampled_from([1, 1, 2]))
    tokens = steps + 1 if topk == 1 else draw(st.integers(2, 1 + topk + (steps - 1) * topk**2))
    return ProtocolConfig(
        mode=mode, war_barrier=barrier, topk=topk, num_steps=steps, num_draft_tokens=tokens,
        seq_lens_d2h=draw(st.sampled_from(list(SeqLensD2H))),
        publish_point=draw(st.sampled_from(list(PublishPoint))),
        gather=draw(st.sampled_from([Gather.UNFUSED, Gather.FUSED])),
        hidden_states=draw(st.booleans()), debug_poison=draw(st.booleans()),
        plan_stream=draw(st.booleans()),
        swa=barrier == WarBarrier.AFTER_LAUNCH and draw(st.booleans()),
    )


@st.composite
def workloads(draw) -> Workload:
    iters = draw(st.integers(3, 8))
    n = draw(st.integers(1, 4))
    reqs = tuple(Request(id=f"R{i}", arrive=draw(st.integers(0, iters - 1)),
                         prompt_len=draw(st.integers(2, 12)), max_new=draw(st.integers(1, 12)))
                 for i in range(n))
    events = []
    if draw(st.booleans()):
        events.append(WorkloadEvent(at=draw(st.integers(0, iters - 1)), kind=EventKind.IDLE))
    return Workload(iterations=iters, requests=reqs, events=tuple(events))


def spec(sc: Scenario, removed: frozenset[str], expect: Expect) -> RunSpec:
    return RunSpec(sc, "-".join(sorted(removed)), sc.protocol, removed, expect, (), "unlisted")


SETTINGS = settings(max_examples=40, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(protocols(), workloads())
def test_correct_variants_are_race_free_and_equal_the_oracle(p, w) -> None:
    sc = Scenario(name="unlisted", protocol=p, workload=w, timing=Timing())
    r = run_spec(spec(sc, frozenset(), Expect.RACE_FREE))
    assert r.error is None, r.error
    assert [x.describe() for x in r.races] == []
    assert r.faults == [] and r.value_diffs == []


@SETTINGS
@given(protocols(), workloads(), st.integers(0, 50))
def test_a_removed_sync_never_corrupts_values_silently(p, w, pick) -> None:
    sc = Scenario(name="unlisted", protocol=p, workload=w, timing=Timing())
    base = run_spec(spec(sc, frozenset(), Expect.RACE_FREE))
    if not base.labels_used:
        return
    label = base.labels_used[pick % len(base.labels_used)]
    r = run_spec(spec(sc, frozenset({label}), Expect.RACE))
    if r.value_diffs:
        assert r.races, f"{label}: values differ from the oracle but no race was found"
    assert dataclasses.asdict(r.metrics) is not None
