"""The Perfetto trace draws each race as a flow between its two accesses' slices and each
record -> wait as a flow, for ``check --out`` (the recorder) and ``run --out`` (the
simulator); a plot of many races draws one connector per pair of sites.

Every race here is computed by the detector (a checked program, or a SimDevice run); the
flows are checked against the slices the trace itself holds (which slice encloses each flow
end), not against the code that placed them.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from overlap_harness.cli import main
from overlap_harness.model.race_groups import group_races
from overlap_harness.model.results import CaseResult
from overlap_harness.reports.perfetto import trace_events
from overlap_harness.reports.race_sites import MAX_SINGLE_RACES, plotted_groups
from overlap_harness.reports.timeline import plot_timeline
from tests.reports.conftest import make_case

# two events and a wait_stream: three waits bound to a record, and one wait on an event
# never recorded (no record, so no arrow); racy: the default stream reads `later` unordered
# with the side stream's fill (the wait was issued before `ready` was recorded again)
PROGRAM = textwrap.dedent("""\
    import sys
    import torch

    side = torch.cuda.Stream()
    first = torch.zeros(8, device="cuda")
    later = torch.zeros(8, device="cuda")
    ready = torch.cuda.Event()
    never = torch.cuda.Event()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first.fill_(1.0)
        ready.record()
    torch.cuda.current_stream().wait_event(never)
    if "--fixed" not in sys.argv:
        torch.cuda.current_stream().wait_event(ready)
    with torch.cuda.stream(side):
        later.fill_(2.0)
        ready.record()
    if "--fixed" in sys.argv:
        torch.cuda.current_stream().wait_event(ready)
    total = first + later
    """)


def _slices(events: list[dict]) -> dict[int, dict]:
    """Op id -> its slice (``X`` events only: a flow binds to slices)."""
    return {e["args"]["op"]: e for e in events if e["ph"] == "X"}


def _enclosing(events: list[dict], point: dict) -> list[int]:
    """The ops whose slices, on the flow event's thread, hold its time."""
    return [op for op, e in _slices(events).items()
            if (e["pid"], e["tid"]) == (point["pid"], point["tid"])
            and e["ts"] <= point["ts"] <= e["ts"] + e["dur"]]


def _flows(events: list[dict], cat: str) -> list[tuple[dict, dict]]:
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == cat}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == cat}
    assert starts.keys() == ends.keys()
    assert all(e.get("bp") == "e" for e in ends.values())
    return [(starts[i], ends[i]) for i in sorted(starts)]


def _check_case(tmp_path: Path, *args: str) -> CaseResult:
    """``check --out`` of PROGRAM, read back as the case the reports drew."""
    from overlap_harness.recorder.api import check_script

    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    out = tmp_path / f"out{len(args)}"
    assert main(["check", "--cpu", "--out", str(out), str(path), *args]) == (0 if args else 1)
    result = check_script(path, list(args), mode="cpu")
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert trace == json.loads(json.dumps(trace_events(result.to_case())))
    return result.to_case()


@pytest.mark.parametrize("fixed", [False, True])
def test_check_trace_has_a_flow_per_race_between_its_accesses(tmp_path, fixed):
    case = _check_case(tmp_path, *(["--fixed"] if fixed else []))
    events = trace_events(case)
    flows = _flows(events, "race")
    assert len(case.races) == (0 if fixed else 1) == len(flows)
    for race, (start, end) in zip(case.races, flows, strict=True):
        ends = {op for point in (start, end) for op in _enclosing(events, point)}
        assert ends == {race.first.op, race.second.op}
        names = {_slices(events)[op]["name"] for op in ends}
        assert names == {"fill_", "add"} and start["ts"] <= end["ts"]


@pytest.mark.parametrize("fixed", [False, True])
def test_check_trace_has_a_flow_per_record_to_wait(tmp_path, fixed):
    case = _check_case(tmp_path, *(["--fixed"] if fixed else []))
    events = trace_events(case)
    slices = _slices(events)
    flows = _flows(events, "event")
    # the program's waits on a recorded event: wait_stream and wait_event(ready); the wait
    # on `never` binds to nothing
    assert len(flows) == 2
    waits = [t for t in case.timeline if str(t.kind) == "wait"]
    assert len(waits) == 3
    for start, end in flows:
        (rec,), (wait,) = _enclosing(events, start), _enclosing(events, end)
        assert (slices[rec]["args"]["kind"], slices[wait]["args"]["kind"]) == ("record", "wait")
        assert slices[rec]["tid"] != slices[wait]["tid"]
    # which record the ready wait bound to: the first record racy, the second fixed
    ready = [(s, e) for s, e in flows if s["name"] == "ready.record"]
    (rec,) = _enclosing(events, ready[0][0])
    source_line = int(slices[rec]["args"]["source"].rsplit(":", 1)[1])
    assert source_line == (18 if fixed else 12)


def test_sim_trace_flows_join_each_race_and_record_wait(tmp_path):
    case = make_case(tmp_path, iterations=4, mutation="no_publish_wait")
    events = trace_events(case)
    flows = _flows(events, "race")
    assert len(flows) == len(case.races) >= 2
    for race, (start, end) in zip(case.races, flows, strict=True):
        ends = {op for point in (start, end) for op in _enclosing(events, point)}
        assert {race.first.op, race.second.op} <= ends
    by_op = {t.op: t for t in case.timeline}
    for start, end in _flows(events, "event"):
        kinds = {str(by_op[op].kind) for op in _enclosing(events, start)}
        assert "record" in kinds
        assert "wait" in {str(by_op[op].kind) for op in _enclosing(events, end)}
    base_events = trace_events(make_case(tmp_path, iterations=4))
    assert _flows(base_events, "race") == [] and _flows(base_events, "event")


def test_groups_partition_the_races_by_their_pair_of_sites(tmp_path):
    case = make_case(tmp_path, iterations=16, mutation="no_publish_wait")
    assert len(case.races) > MAX_SINGLE_RACES
    groups = group_races(case.races)
    assert sorted(id(r) for g in groups for r in g.races) == sorted(id(r) for r in case.races)
    for group in groups:
        sides = {(r.kind, r.buffer, r.first.source, r.first.agent, r.first.mode,
                  r.second.source, r.second.agent, r.second.mode) for r in group.races}
        assert len(sides) == 1 and group.count == len(group.races)
    keys = [g.key for g in groups]
    assert len(set(keys)) == len(keys) < len(case.races)  # a loop races at the same sites
    assert plotted_groups(case.races) == groups
    few = case.races[:MAX_SINGLE_RACES]
    assert [g.races for g in plotted_groups(few)] == [[r] for r in few]


def test_a_plot_of_many_races_draws_one_arrow_per_pair_of_sites(tmp_path):
    case = make_case(tmp_path, iterations=16, mutation="no_publish_wait")
    pairs = len(group_races(case.races))
    title = plot_timeline(case).get_suptitle().replace("\n", " ")
    assert f"{len(case.races)} races drawn as {pairs} arrows, one per pair of sites" in title
    few = make_case(tmp_path, iterations=3, mutation="no_publish_wait")
    assert len(few.races) <= MAX_SINGLE_RACES
    assert "arrows" not in plot_timeline(few).get_suptitle()
