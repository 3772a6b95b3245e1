"""results.json written faster, the same bytes (issue 17 item 2).

The timelines are written by ``reports.jsonout.timeline_text`` instead of json's generic
indenting encoder; the oracle here is json itself over ``dataclasses.asdict``, as the file
was written before.
"""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import Access, OpKind, OpRecord, Race, RaceKind
from overlap_harness.reports.jsonout import to_json

records = st.builds(
    OpRecord, op=st.integers(0, 2**40), name=st.text(max_size=12), agent=st.text(max_size=8),
    kind=st.sampled_from(list(OpKind)), issue_ns=st.integers(-2**63, 2**63),
    start_ns=st.integers(0, 10**12), end_ns=st.integers(0, 10**12),
    label=st.none() | st.text(max_size=10), iteration=st.integers(-1, 10**6),
    source=st.text(max_size=20))
cases = st.builds(
    CaseResult, run_id=st.text(max_size=10), scenario=st.text(max_size=6),
    mutation=st.text(max_size=6), path=st.just("x.toml"), expect=st.just("race"),
    verdict=st.just("race"), ok=st.booleans(), timeline=st.lists(records, max_size=4),
    config=st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4),
                           max_size=3))


def json_as_before(results: list[CaseResult]) -> str:
    """results.json as json wrote it: asdict per timeline entry, one generic dumps."""
    docs = []
    for r in results:
        doc = json.loads(to_json([r]))["cases"][0]  # every key but the timeline and config
        doc["timeline"] = [{**dataclasses.asdict(t), "kind": str(t.kind)} for t in r.timeline]
        doc["config"] = r.config
        docs.append(doc)
    summary = {"cases": len(results), "ok": sum(r.ok for r in results),
               "failed": sum(not r.ok for r in results)}
    return json.dumps({"summary": summary, "cases": docs}, indent=1, default=str) + "\n"


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(cases, max_size=3))
def test_results_with_timelines_are_the_bytes_json_writes(results) -> None:
    assert to_json(results, with_timeline=True) == json_as_before(results)


def test_a_timeline_is_written_under_its_case() -> None:
    record = OpRecord(op=7, name='say "hi"\n', agent="forward", kind=OpKind.KERNEL,
                      issue_ns=1, start_ns=2, end_ns=3, label=None, iteration=0, source="é")
    case = CaseResult(run_id="r", scenario="s", mutation="", path="p", expect="race",
                      verdict="race", ok=True, timeline=[record])
    doc = json.loads(to_json([case], with_timeline=True))
    assert doc["cases"][0]["timeline"] == [
        {"op": 7, "name": 'say "hi"\n', "agent": "forward", "kind": "kernel", "issue_ns": 1,
         "start_ns": 2, "end_ns": 3, "label": None, "iteration": 0, "source": "é"}]
    assert "timeline" not in json.loads(to_json([case]))["cases"][0]


accesses = st.builds(
    Access, op=st.integers(0, 2**40), op_name=st.text(max_size=8), agent=st.text(max_size=6),
    buffer=st.text(max_size=8), mode=st.sampled_from(["read", "write"]),
    iteration=st.integers(-1, 10**6), source=st.text(max_size=12),
    label=st.none() | st.text(max_size=6), time_ns=st.none() | st.integers(0, 10**12))
races = st.builds(
    Race, kind=st.sampled_from(list(RaceKind)), buffer=st.text(max_size=8),
    shape=st.lists(st.integers(1, 64), min_size=1, max_size=3).map(tuple),
    elements=st.lists(st.integers(0, 2**20), max_size=40).map(tuple), first=accesses,
    second=accesses, manifest=st.none() | st.booleans(), reused_as=st.none() | st.text(max_size=4),
    older=st.booleans(), needs=st.lists(st.text(max_size=5), max_size=2).map(tuple))


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(races, max_size=4))
def test_races_are_written_as_json_writes_their_asdict(found) -> None:
    case = CaseResult(run_id="r", scenario="s", mutation="", path="p", expect="race",
                      verdict="race", ok=True, races=found)
    doc = json.loads(to_json([case]))
    as_before = [{**dataclasses.asdict(x), "kind": str(x.kind), "key": x.key,
                  "report": x.describe()} for x in found]
    assert to_json([case]) == json.dumps({"summary": doc["summary"], "cases": [
        {**doc["cases"][0], "races": as_before}]}, indent=1, default=str) + "\n"
