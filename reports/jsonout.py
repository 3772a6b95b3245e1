"""JSON results: every case with its verdict, races, value diffs and metrics."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from overlap_harness.model.results import CaseResult


def case_to_dict(r: CaseResult, with_timeline: bool = False) -> dict[str, Any]:
    """A JSON-ready dict of one case (the timeline only on request: it is long)."""
    d: dict[str, Any] = {
        "run_id": r.run_id, "scenario": r.scenario, "mutation": r.mutation, "path": r.path,
        "expect": r.expect, "verdict": r.verdict, "ok": r.ok, "manifest": r.manifest,
        "removed": list(r.removed), "missing": r.missing, "error": r.error,
        "races": [{**dataclasses.asdict(x), "kind": str(x.kind), "key": x.key,
                   "report": x.describe()} for x in r.races],
        "value_diffs": r.value_diffs,
        "faults": r.faults,
        "uninit_reads": r.uninit_reads,
        "dup_writes": r.dup_writes,
        "metrics": None if r.metrics is None else dataclasses.asdict(r.metrics),
        "skipped_syncs": [list(s) for s in r.skipped_syncs],
    }
    if with_timeline:
        d["timeline"] = [{**dataclasses.asdict(t), "kind": str(t.kind)} for t in r.timeline]
        d["config"] = r.config
    return d


def to_json(results: Sequence[CaseResult], with_timeline: bool = False) -> str:
    """The JSON document for ``results``."""
    cases = [case_to_dict(r, with_timeline) for r in results]
    summary = {"cases": len(results), "ok": sum(r.ok for r in results),
               "failed": sum(not r.ok for r in results)}
    return json.dumps({"summary": summary, "cases": cases}, indent=1, default=str) + "\n"
