"""JSON results: every case with its verdict, races, value diffs and metrics."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import OpRecord, Race

_encode_text = json.encoder.encode_basestring_ascii  # what json.dumps uses for text (ASCII)
_CASE_KEY_DEPTH = 3  # {"cases": [{"timeline": ...: a case's keys are indented 3 spaces
_MARK = re.compile(r'"\\u0000timeline \d+\\u0000"')


def case_to_dict(r: CaseResult, with_timeline: bool = False) -> dict[str, Any]:
    """A JSON-ready dict of one case (the timeline only on request: it is long)."""
    d: dict[str, Any] = {
        "run_id": r.run_id, "scenario": r.scenario, "mutation": r.mutation, "path": r.path,
        "expect": r.expect, "verdict": r.verdict, "ok": r.ok, "manifest": r.manifest,
        "removed": list(r.removed), "missing": r.missing, "error": r.error,
        "races": [{**_race_dict(x), "kind": str(x.kind), "key": x.key,
                   "report": x.describe()} for x in r.races],
        "value_diffs": r.value_diffs,
        "faults": r.faults,
        "uninit_reads": r.uninit_reads,
        "dup_writes": r.dup_writes,
        "metrics": None if r.metrics is None else dataclasses.asdict(r.metrics),
        "skipped_syncs": [list(s) for s in r.skipped_syncs],
    }
    if with_timeline:
        d["timeline"] = [_record_dict(t) for t in r.timeline]
        d["config"] = r.config
    return d


@functools.cache
def _field_names(record_type: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(record_type))


def _record_dict(record: OpRecord) -> dict[str, Any]:
    """``dataclasses.asdict`` of a timeline entry, kind as text: its fields are plain values
    (ints, text, None, the kind), so a shallow copy is the same dict, and asdict's deep copy
    was nearly half of writing a suite's results.json (issue 17 item 2)."""
    d = {name: getattr(record, name) for name in _field_names(type(record))}
    d["kind"] = str(record.kind)
    return d


def _race_dict(race: Race) -> dict[str, Any]:
    """``dataclasses.asdict`` of a race as json writes it: its accesses as dicts of their
    fields, the rest as they are. asdict copies every element id of a tuple one call at a
    time (the races' element lists were half of writing ``--json`` results); json writes a
    tuple as the list it copied, so the text is the same."""
    d = {name: getattr(race, name) for name in _field_names(type(race))}
    for side in ("first", "second"):
        access = d[side]
        d[side] = {name: getattr(access, name) for name in _field_names(type(access))}
    return d


def _scalar(value: Any) -> str:
    """``value`` as ``json.dumps(value, default=str)`` writes it, for the types of a
    timeline entry (the rest goes through json itself)."""
    if isinstance(value, str):
        return _encode_text(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    return json.dumps(value, default=str)


def timeline_text(timeline: Sequence[OpRecord], depth: int) -> str:
    """The JSON text ``json.dumps(..., indent=1, default=str)`` writes for the list of
    :func:`_record_dict` entries of ``timeline`` when the list is a value at ``depth``
    (the key's indent), without its generic encoder: json indents in pure Python, one call
    per value, and the timelines are most of results.json (issue 17 item 2)."""
    if not timeline:
        return "[]"
    item_pad = "\n" + " " * (depth + 1)
    key_pad = ",\n" + " " * (depth + 2)
    entries = []
    for record in timeline:
        fields = _record_dict(record)
        entries.append("{" + key_pad[1:] + key_pad.join(
            f"{_encode_text(key)}: {_scalar(value)}" for key, value in fields.items())
            + item_pad + "}")
    return "[" + item_pad + ("," + item_pad).join(entries) + "\n" + " " * depth + "]"


def to_json(results: Sequence[CaseResult], with_timeline: bool = False,
            partial: bool = False) -> str:
    """The JSON document for ``results`` (``json.dumps``, indent 1; each timeline written
    by :func:`timeline_text`, the same text faster); ``partial``: Ctrl-C stopped the suite,
    ``results`` are the runs that finished (the document says ``"partial": true``)."""
    cases = [case_to_dict(r) for r in results]
    marks = {}
    if with_timeline:
        for i, (r, d) in enumerate(zip(results, cases, strict=True)):
            mark = f"\0timeline {i}\0"  # no JSON value of a case holds a NUL
            d["timeline"] = mark
            d["config"] = r.config
            marks[json.dumps(mark)] = timeline_text(r.timeline, _CASE_KEY_DEPTH)
    summary = {"cases": len(results), "ok": sum(r.ok for r in results),
               "failed": sum(not r.ok for r in results)}
    document: dict[str, Any] = {"summary": summary, "cases": cases}
    if partial:
        document["partial"] = True
    text = json.dumps(document, indent=1, default=str) + "\n"
    if marks:
        text = _MARK.sub(lambda found: marks[found.group(0)], text)
    return text
