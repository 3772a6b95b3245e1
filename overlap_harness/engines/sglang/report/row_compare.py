"""Loop-report rows compared across changes of the harness's own files.

A race side in harness code (a stand-in kernel or worker) is written with its file and line
(``.../overlap_harness/engines/sglang/stand_ins/model_worker.py:158``), which move when the
harness's files do; SGLang's sides do not. Two reports agree when their rows do with every
harness location replaced by one mark: the row's variant, site, verdicts, model labels and
every SGLang location compared exactly, a harness side by its identity in the race text (the
declared op's name and its stream, ``model_forward on self.forward_stream``), not by where
the harness keeps it (a graph-captured op's ``captured at graph_model.py:147`` likewise).

Two things are left out of the comparison, because they vary between runs of the same code
(seen between the reports before and after the harness's layout changed, with every verdict
equal): races of the caching allocator's address reuse (``reuse X@...``: which freed buffer
a later allocation takes first, and so its name and line, follows the process's memory
state), and with them the row's race count (one more or fewer such race).
"""

from __future__ import annotations

import re
from typing import Any

#: a location in the harness's SGLang adapter, from any checkout's prefix on
HARNESS_LOCATION = re.compile(r"\S*overlap_harness/engines/sglang/[\w/]+\.py:\d+")
#: where a replayed graph's op was captured, named by file only: the harness's stand-ins
#: (the files that capture, before and after the layout; SGLang has no file of these names)
HARNESS_CAPTURE = re.compile(r"captured at (?:graph_runner|graph_model|eagle_graph|"
                             r"eagle_verify_graph|draft_extend_graph)\.py:\d+")
HARNESS_MARK = "<harness>"
#: fields that vary between runs of the same code (module docstring)
VOLATILE_FIELDS = ("races",)


def normalised(value: Any) -> Any:
    """``value`` (a row, or any part of one) with every harness location replaced by
    :data:`HARNESS_MARK`."""
    if isinstance(value, str):
        value = HARNESS_CAPTURE.sub(f"captured at {HARNESS_MARK}", value)
        return HARNESS_LOCATION.sub(HARNESS_MARK, value)
    if isinstance(value, list):
        return [normalised(item) for item in value]
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items()}
    return value


def compared(row: dict[str, Any]) -> dict[str, Any]:
    """What of ``row`` two reports must agree on: the row normalised, without its volatile
    fields and its allocator-reuse race examples."""
    kept = {key: value for key, value in normalised(row).items() if key not in VOLATILE_FIELDS}
    kept["race_examples"] = [example for example in kept.get("race_examples", [])
                             if not example.startswith("reuse ")]
    return kept


def keyed_rows(report: dict[str, Any], variants: set[str] | None = None
               ) -> dict[tuple[str, str], dict[str, Any]]:
    """The report's rows (of ``variants``; None: all), as compared, by (variant, site)."""
    return {(row["variant"], row["site"]): compared(row) for row in report["rows"]
            if variants is None or row["variant"] in variants}


def differences(before: dict[str, Any], after: dict[str, Any],
                variants: set[str] | None = None) -> list[str]:
    """Each row of ``before`` missing from ``after``, or different there (field by field),
    and each row ``after`` adds; empty when they agree."""
    old, new = keyed_rows(before, variants), keyed_rows(after, variants)
    problems = [f"{key}: missing" for key in old if key not in new]
    problems += [f"{key}: new row" for key in new if key not in old]
    for key in old.keys() & new.keys():
        for field in sorted(old[key].keys() | new[key].keys()):
            if old[key].get(field) != new[key].get(field):
                problems.append(f"{key} {field}: {old[key].get(field)!r} -> "
                                f"{new[key].get(field)!r}")
    return sorted(problems)


def harness_files(report: dict[str, Any]) -> set[str]:
    """The harness files the report's race sides name (``stand_ins/model_worker.py``)."""
    found = set()
    for row in report["rows"]:
        for example in row.get("race_examples", []):
            for location in HARNESS_LOCATION.findall(example):
                path = location.rsplit(":", 1)[0]
                found.add(path.split("overlap_harness/engines/sglang/", 1)[1])
    return found
