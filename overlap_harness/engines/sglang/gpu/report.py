"""The GPU conformance report of SGLang's loop: ``sglang-VERSION-loop-gpu.{json,md}``.

One row per (variant, removed site) of the loop report that the CPU mode judged (``race`` or
``race_free``), plus one row per variant without a site (the unmodified loop): how many forced
trials ran on the device, with which delays, how many left a value different from the serial
answer, and the first such value. :func:`problems` checks a report against the loop report
(the committed pair is checked in CI, which has no GPU).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: a necessary row without a wrong value says why in ``why`` (its key in ``why_reason``)
NO_WRONG_REASONS = {
    "overwritten": "the race was made (probe), but the corrupted value is overwritten or not "
                   "read before it reaches the compared buffers",
    "timing": "the race needs a timing the delay of its earlier side cannot make (probe)",
    "crashed": "a forced trial crashed (the race broke the loop) instead of finishing with a "
               "wrong value",
    "unprobed": "every forced trial equals the serial answer; no probe ran",
    "not_run": "the row's trials did not run (error or budget): see error",
}


def document(rows: list[dict[str, Any]], *, version: str, device: str, torch_version: str,
             date: str, command: str, failures: list[str], seconds: float) -> dict[str, Any]:
    """The report's JSON document (rows in site, then variant order; unmodified rows first)."""
    rows = sorted(rows, key=lambda r: (r["site"] is not None, r["site"] or "", r["variant"]))
    for row in rows:
        row.pop("race_examples", None)
        row.setdefault("trials", 0)
        row.setdefault("wrong_trials", 0)
        row.setdefault("example_wrong", None)
        if row["cpu_verdict"] == "race" and not row["wrong_trials"]:
            row["why_reason"], row["why"] = _why_no_wrong(row)
    return {"sglang_version": version, "device": device, "torch": torch_version, "date": date,
            "command": command, "seconds": round(seconds, 1), "child_failures": failures,
            "summary": summary(rows), "rows": rows}


def _why_no_wrong(row: dict[str, Any]) -> tuple[str, str]:
    """Why a necessary row shows no wrong value, computed from what its trials did (never
    hand-written): not run; a trial crashed; else the probes' finding (gpu_probe.why_equal)
    for each delayed stream: ``overwritten`` if any made the race, else ``timing``."""
    from overlap_harness.engines.sglang.gpu.probe import why_equal

    if not row["trials"]:
        return "not_run", f"{NO_WRONG_REASONS['not_run']} ({row.get('error') or 'no trials'})"
    if row.get("crashed_trials"):
        return "crashed", (f"{row['crashed_trials']} of {row['trials']} forced trials crashed "
                           f"instead of finishing with a wrong value "
                           f"({row.get('example_crash')}); the others equal the serial answer")
    found = [why_equal(p["counts"], p) for p in row.get("probes", [])]
    if not found:
        return "unprobed", NO_WRONG_REASONS["unprobed"]
    key = "overwritten" if any(k == "overwritten" for k, _ in found) else "timing"
    delays = ", ".join(sorted(set(row.get("forced_delay", []))))
    return key, f"all {row['trials']} forced trials ({delays}) equal the serial answer; " \
        + "; ".join(text for _, text in found)


def summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Counts: necessary rows with a wrong value, redundant rows all equal, and so on."""
    def count(verdict: str | None, wrong: bool) -> int:
        return sum(1 for r in rows if r["cpu_verdict"] == verdict and r["trials"]
                   and not r.get("error") and bool(r["wrong_trials"]) == wrong)
    return {"rows": len(rows),
            "race_rows_wrong": count("race", True), "race_rows_all_equal": count("race", False),
            "race_free_rows_all_equal": count("race_free", False),
            "race_free_rows_wrong": count("race_free", True),
            "unmodified_all_equal": count(None, False), "unmodified_wrong": count(None, True),
            "errors": sum(1 for r in rows if r.get("error")),
            **{f"race_rows_why_{key}": sum(1 for r in rows if r.get("why_reason") == key)
               for key in NO_WRONG_REASONS}}


def problems(report: dict[str, Any], loop_report: dict[str, Any]) -> list[str]:
    """What in ``report`` disagrees with ``loop_report`` or with itself (empty: consistent)."""
    real = {(r["variant"], r["site"]): r["real"] for r in loop_report["rows"]}
    out = []
    if report["sglang_version"] != loop_report["sglang_version"]:
        out.append(f"version {report['sglang_version']} != {loop_report['sglang_version']}")
    for row in report["rows"]:
        where = f"{row['variant']} {row['site']}"
        if row["site"] is not None and real.get((row["variant"], row["site"])) \
                != row["cpu_verdict"]:
            out.append(f"{where}: cpu_verdict {row['cpu_verdict']} but the loop report says "
                       f"{real.get((row['variant'], row['site']))}")
        if not 0 <= row["wrong_trials"] <= row["trials"]:
            out.append(f"{where}: {row['wrong_trials']} wrong of {row['trials']} trials")
        if bool(row["wrong_trials"]) != (row["example_wrong"] is not None):
            out.append(f"{where}: wrong_trials and example_wrong disagree")
        if row["trials"] and len(row.get("forced_delay", [])) != row["trials"]:
            out.append(f"{where}: {row['trials']} trials but {len(row['forced_delay'])} delays")
        if row["cpu_verdict"] == "race" and not row["wrong_trials"] and (
                not row.get("why") or row.get("why_reason") not in NO_WRONG_REASONS):
            out.append(f"{where}: a necessary row without a wrong value says no why")
    judged = {(v, s) for (v, s), verdict in real.items() if verdict in ("race", "race_free")}
    present = {(r["variant"], r["site"]) for r in report["rows"] if r["site"] is not None}
    variants = {r["variant"] for r in report["rows"]}
    for key in sorted(judged - present, key=str):
        if key[0] in variants:
            out.append(f"{key[0]} {key[1]}: judged in the loop report, no row here")
    return out


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    s = report["summary"]
    lines = [
        f"# SGLang {report['sglang_version']}'s own overlap loop on a GPU, races forced",
        "",
        "Written by `overlap-harness sglang --gpu` (overlap_harness/engines/sglang/"
        "gpu/table.py, gpu/loop.py, gpu/report.py; docs/sglang-loop.md: GPU mode).",
        "",
        f"Device: {report['device']}; torch {report['torch']}; {report['date']}; "
        f"{report['seconds']} s wall.",
        f"Command: `{report['command']}`",
        "",
        f"Necessary rows (CPU verdict race) with a wrong value: {s['race_rows_wrong']}, "
        f"without: {s['race_rows_all_equal']}; redundant rows (race_free) bit-identical in "
        f"every trial: {s['race_free_rows_all_equal']}, with a wrong value: "
        f"{s['race_free_rows_wrong']}; unmodified loop bit-identical: "
        f"{s['unmodified_all_equal']} variants, wrong: {s['unmodified_wrong']}; rows with an "
        f"error: {s['errors']}.",
        "",
        "Necessary rows without a wrong value, by the computed why (`why_reason`; "
        "gpu/probe.py): " + ", ".join(f"{key} {s.get('race_rows_why_' + key, 0)}"
                                      for key in NO_WRONG_REASONS) + ".",
        "",
        "| variant | site | code | cpu_verdict | trials | forced_delay | wrong_trials | "
        "example wrong value / why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        delays = ", ".join(sorted(set(row.get("forced_delay", []))))
        note = row["example_wrong"] or row.get("why") or row.get("error") or ""
        if row.get("error") and row["example_wrong"] is None:
            note = f"error: {row['error']}"
        code = f"`{row['code']}`" if row["code"] else "(unmodified loop)"
        lines.append(f"| {row['variant']} | {row['site'] or '-'} | {code} | "
                     f"{row['cpu_verdict'] or '-'} | {row['trials']} | {delays} | "
                     f"{row['wrong_trials']} | {_cell(note)} |")
    if report["child_failures"]:
        lines += ["", "Child processes that failed: " + "; ".join(report["child_failures"])]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:700]


def write(report: dict[str, Any], folder: Path) -> list[Path]:
    """``sglang-VERSION-loop-gpu.json`` and ``.md`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"sglang-{report['sglang_version']}-loop-gpu"
    paths = [folder / f"{stem}.json", folder / f"{stem}.md"]
    paths[0].write_text(json.dumps(report, indent=1) + "\n")
    paths[1].write_text(markdown(report))
    return paths
