"""Gates from a simulated run (overlap_harness.replay.gates), checked on CPU.

What a GPU can keep is op-level order: an op's work after another op's end, plus the
program's own happens-before edges. For every race of the delayed prediction, the access the
simulator ran first must reach the other's op through those edges and the gates, or a GPU is
free to run the pair the other way round; and the whole must be acyclic, or it deadlocks.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import pytest

from overlap_harness.model.trace import OpRecord
from overlap_harness.replay.gates import gate_pairs, op_keys
from overlap_harness.replay.plan import plan_spec
from overlap_harness.runner import simulate
from overlap_harness.scenarios.expand import expand
from overlap_harness.scenarios.loader import load_paths

SUITE = Path(__file__).resolve().parents[2] / "scenarios"
RUNS = [("protocol/s04_host_reads_pinned_early.toml", "d2h.host_sync"),
        ("protocol/s10_forward_entry_raw.toml", "forward_entry"),
        ("variants/plan_stream.toml", "plan.schedule_wait")]


def access_ns(rec: OpRecord, mode: str) -> int:
    return rec.end_ns if mode == "write" else rec.start_ns


@pytest.mark.parametrize(("path", "mutation"), RUNS, ids=[m for _p, m in RUNS])
def test_gates_order_every_predicted_race_as_simulated_and_stay_acyclic(path: str,
                                                                        mutation: str) -> None:
    (sc,) = load_paths([SUITE / path])
    spec = next(s for s in expand(sc) if (s.mutation_name or "base") == mutation)
    plan = plan_spec(spec, host_launch_us=200.0)
    assert plan.kind == "racy" and plan.gates
    _outcome, dev = simulate(plan.scenario, spec.removed, delays=plan.delays, jitter=0.0)
    run = dev.finish()
    gates, dropped = gate_pairs(dev.det, run.timeline)
    assert (gates, dropped) == (plan.gates, plan.gates_dropped)  # deterministic
    by_key = {k: op for op, k in op_keys(run.timeline).items()}
    g = nx.DiGraph(dev.det.edges)
    g.add_edges_from((by_key[a], by_key[b]) for a, b in gates)
    assert nx.is_directed_acyclic_graph(g)
    recs = {r.op: r for r in run.timeline}
    assert run.races
    for r in run.races:
        a, b = r.first, r.second
        ta, tb = access_ns(recs[a.op], a.mode), access_ns(recs[b.op], b.mode)
        early, late = (a.op, b.op) if (ta, a.mode != "write") <= (tb, b.mode != "write") \
            else (b.op, a.op)
        assert nx.has_path(g, early, late), r.describe()


def test_a_race_free_run_needs_no_gate() -> None:
    (sc,) = load_paths([SUITE / "protocol/s04_host_reads_pinned_early.toml"])
    spec = next(s for s in expand(sc) if (s.mutation_name or "base") == "base")
    _outcome, dev = simulate(spec.scenario, spec.removed, jitter=0.0)
    assert gate_pairs(dev.det, dev.finish().timeline) == ([], 0)
