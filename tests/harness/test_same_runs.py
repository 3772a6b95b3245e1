"""Runs of one key, run once: ``run_scenarios`` simulates each distinct run of a suite once
and judges a copy for every spec that asks for it (issue 17: 12 of the bundled suite's 115
runs repeat another scenario's base configuration).

The reference is each spec run on its own (``run_spec``, nothing shared): the suite's
results must equal those, spec by spec, in names, verdicts, ``ok``, missing races and
errors, with one simulation per distinct run."""

from __future__ import annotations

import dataclasses

import pytest

from overlap_harness import runner
from overlap_harness.model.config import (
    Check,
    Expect,
    Mutation,
    ProtocolConfig,
    Request,
    Scenario,
    Timing,
    Workload,
)
from overlap_harness.reports.jsonout import case_to_dict
from overlap_harness.scenarios.expand import expand

WORKLOAD = Workload(iterations=3, requests=(Request(id="A", arrive=0, prompt_len=4, max_new=4),))
RACY = "publish_ready.d2h_wait"  # removing it races on new_seq_lens_buf in this workload
NEVER = "plan.forward_wait"  # no plan stream here: a label this configuration never reaches


def _scenario(name: str, *mutations: Mutation, **check: object) -> Scenario:
    return Scenario(name=name, description=f"the {name} file", workload=WORKLOAD,
                    check=Check(**check), mutation=mutations, path=f"/suite/{name}.toml")


SUITE = [
    _scenario("a", Mutation(remove=(RACY,), races=("RAW new_seq_lens_buf",))),
    # the same runs as "a": its base expects wrongly, its mutation misses a race it names
    _scenario("b", Mutation(remove=(RACY,), races=("WAR seq_lens",)), expect=Expect.RACE),
    # a removal never reached: an error in "c", accepted in "d"; the same run for both
    _scenario("c", Mutation(remove=(NEVER,))),
    _scenario("d", Mutation(remove=(NEVER,), allow_unused=True, expect=Expect.RACE_FREE)),
    # another seed: another run
    _scenario("e", seed=7),
]


def _unhashed(run_id: str) -> str:
    """``scenario/mutation`` of a run id, without its hash."""
    return run_id.rsplit("-", 1)[0]


def _json(results) -> list[dict]:
    return [case_to_dict(r, with_timeline=True) for r in results]


@pytest.fixture(scope="module")
def alone():
    """Every spec run on its own."""
    return [runner.run_spec(spec) for sc in SUITE for spec in expand(sc)]


def test_each_distinct_run_is_simulated_once(monkeypatch, alone) -> None:
    ran = []

    def counted(spec, **kwargs):
        ran.append(spec.run_id)
        return execute(spec, **kwargs)

    execute = runner.execute
    monkeypatch.setattr(runner, "execute", counted)
    results = runner.run_scenarios(SUITE)
    assert [_unhashed(run_id) for run_id in ran] == [
        "a/base", "a/publish_ready.d2h_wait", "c/plan.forward_wait", "e/base"]
    assert _json(results) == _json(alone)
    assert [r.config for r in results] == [r.config for r in alone]


def test_each_copy_is_judged_against_its_own_spec(alone) -> None:
    results = runner.run_scenarios(SUITE)
    got = [(_unhashed(r.run_id), r.path, r.expect, r.verdict, r.ok, r.missing) for r in results]
    assert got == [
        ("a/base", "/suite/a.toml", "race_free", "race_free", True, []),
        ("a/publish_ready.d2h_wait", "/suite/a.toml", "race", "race", True, []),
        ("b/base", "/suite/b.toml", "race", "race_free", False, []),
        ("b/publish_ready.d2h_wait", "/suite/b.toml", "race", "race", False,
         ["WAR seq_lens"]),
        ("c/base", "/suite/c.toml", "race_free", "race_free", True, []),
        ("c/plan.forward_wait", "/suite/c.toml", "race", "error", False, []),
        ("d/base", "/suite/d.toml", "race_free", "race_free", True, []),
        ("d/plan.forward_wait", "/suite/d.toml", "race_free", "race_free", True, []),
        ("e/base", "/suite/e.toml", "race_free", "race_free", True, []),
    ]
    assert results[5].error.startswith('/suite/c.toml: mutation[0].remove[0]: sync label '
                                       '"plan.forward_wait" is never reached')
    assert results[7].error is None
    assert [r.config["name"] for r in results] == list("aabbccdde")


def test_a_pool_gives_the_results_of_one_process(alone) -> None:
    assert _json(runner.run_scenarios(SUITE, jobs=2)) == _json(alone)


def test_the_key_holds_what_a_run_does_and_nothing_else() -> None:
    (base,) = expand(_scenario("a"))
    key = runner.run_key(base)
    renamed = dataclasses.replace(base.scenario, name="z", description="other", path="/z.toml",
                                  check=Check(expect=Expect.RACE, races=("RAW x",)),
                                  mutation=(Mutation(remove=(RACY,)),))
    assert runner.run_key(expand(renamed)[0]) == key
    changed = [
        dataclasses.replace(base, removed=frozenset({RACY})),
        dataclasses.replace(base, protocol=ProtocolConfig(topk=2, num_draft_tokens=4)),
        dataclasses.replace(base, scenario=dataclasses.replace(base.scenario,
                                                               check=Check(seed=1))),
        dataclasses.replace(base, scenario=dataclasses.replace(base.scenario,
                                                               timing=Timing(host_launch=9))),
        dataclasses.replace(base, scenario=dataclasses.replace(
            base.scenario, workload=dataclasses.replace(WORKLOAD, iterations=4))),
    ]
    keys = [runner.run_key(spec) for spec in changed]
    assert key not in keys and len(set(keys)) == len(keys)


def test_results_without_timelines_keep_everything_else(alone) -> None:
    bare = runner.run_scenarios(SUITE, jobs=2, timelines=False)
    assert [r.timeline for r in bare] == [[]] * len(alone)
    assert all(r.timeline for r in alone if r.verdict != "error")
    assert [case_to_dict(r) for r in bare] == [case_to_dict(r) for r in alone]
    assert [r.metrics for r in bare] == [r.metrics for r in alone]
