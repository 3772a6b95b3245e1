"""The suite summary a person opens: one self-contained HTML file and a Markdown twin.

At a glance: a banner with the counts, the results table with racy and failing rows coloured,
then for every racy, faulty or failing case its timeline plot (embedded) and the race reports
naming both accesses; the necessity table when given, with what its signed columns mean; the
sim-vs-GPU rows of the runs that were run, when a GPU suite report under ``reports/gpu/``
has any of them (same run id, so the same configuration); nothing about other runs.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.results import CaseResult
from overlap_harness.reports.tables import NECESSITY_LEGEND

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left}th{background:#eee}tr.race td{background:#fdecea}tr.fault td{background:#fff4d6}
tr.fail td{background:#f8c9c4;font-weight:bold}.banner{font-size:18px;padding:8px 12px;
border-radius:4px}.ok{background:#e3f4e1}.bad{background:#f8c9c4}pre{background:#f6f6f6;
padding:8px;overflow-x:auto}img{max-width:100%;border:1px solid #ddd}"""

HEAD = ["scenario", "mutation", "expect", "verdict", "races", "manifest", "host stall us",
        "fwd bubbles us", "ok"]


def _row(r: CaseResult) -> list[str]:
    m = r.metrics
    return [r.scenario, r.mutation or "base", r.expect, r.verdict,
            ", ".join(r.race_keys()) or "-", "yes" if r.manifest else "no",
            "-" if m is None else f"{m.host_stall_ns / 1000:.0f}",
            "-" if m is None else f"{m.forward_idle_ns / 1000:.0f}", "ok" if r.ok else "FAIL"]


def _css_class(r: CaseResult) -> str:
    return "fail" if not r.ok else "race" if r.races else "fault" if r.faults else ""


def needs_plot(r: CaseResult) -> bool:
    """Racy, faulty or failing cases get a plot and their reports in the summary."""
    return bool(r.races or r.faults or not r.ok)


def case_details(r: CaseResult) -> str:
    """The text under a case's plot: verdict, removed syncs, faults, race reports."""
    lines = [f"{r.name}: expected {r.expect}, computed {r.verdict}"]
    if r.removed:
        lines.append("removed syncs: " + ", ".join(r.removed))
    if r.error:
        lines.append(f"error: {r.error}")
    lines += [f"debug check: {f}" for f in r.faults[:5]]
    lines += [f"device-defined: {d}" for d in r.device_defined[:5]]
    if r.value_diffs:
        lines.append(f"{len(r.value_diffs)} value(s) differ from the serial oracle; first: "
                     f"{r.value_diffs[0]}")
    lines += [race.describe() for race in r.races[:8]]
    if len(r.races) > 8:
        lines.append(f"... and {len(r.races) - 8} more races")
    return "\n".join(lines)


def latest_gpu_report(folder: Path) -> dict[str, Any] | None:
    """The newest suite report JSON under ``folder`` (``<date>-<device>.json``), if any."""
    files = sorted(p for p in folder.glob("*-*.json")
                   if not p.name.startswith(("semantics", "kernels")))
    if not files:
        return None
    try:
        return json.loads(files[-1].read_text()) | {"_file": files[-1].name}
    except (OSError, json.JSONDecodeError):
        return None


def gpu_rows(report: dict[str, Any], results: Sequence[CaseResult]
             ) -> tuple[list[str], list[list[str]]]:
    """The GPU report's rows for the runs in ``results`` (matched by run id), and the keys.

    A run id carries the hash of the run's resolved configuration, so a row is shown only for
    the very run that was simulated; an unrelated scenario gets no GPU table at all.
    """
    runs = report.get("runs") or report.get("cases") or []
    if not runs or not isinstance(runs, list) or not isinstance(runs[0], dict):
        return [], []
    ran = {r.run_id for r in results}
    mine = [run for run in runs if isinstance(run, dict) and run.get("run_id") in ran]
    if not mine:
        return [], []
    keys = [k for k, v in mine[0].items() if isinstance(v, str | int | float | bool)][:9]
    return keys, [[str(run.get(k, "")) for k in keys] for run in mine]


def to_markdown(results: Sequence[CaseResult], plots: dict[str, str],
                necessity: Sequence[Sequence[str]] = (),
                gpu: dict[str, Any] | None = None) -> str:
    """The Markdown summary; ``plots`` maps run ids to PNG paths relative to the file."""
    failed = sum(not r.ok for r in results)
    racy = sum(bool(r.races) for r in results)
    out = ["# overlap-harness suite summary", "",
           f"**{len(results) - failed} passed, {failed} failed**; {racy} runs with races "
           f"found by the detector.", "", "| " + " | ".join(HEAD) + " |",
           "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(_row(r)) + " |" for r in results]
    if necessity:
        out += ["", "## Sync necessity", "",
                "| scenario | sync | verdict | races when removed | manifest | stall saved us "
                "| idle saved us |", "|---|---|---|---|---|---|---|"]
        out += ["| " + " | ".join(row) + " |" for row in necessity]
        out += ["", NECESSITY_LEGEND]
    out += ["", "## Racy, faulty and failing runs"]
    for r in results:
        if needs_plot(r):
            out += ["", f"### {r.name}", ""]
            if r.run_id in plots:
                out.append(f"![{r.name}]({plots[r.run_id]})")
            out += ["", "```", case_details(r), "```"]
    keys, rows = gpu_rows(gpu, results) if gpu else ([], [])
    if rows and gpu:
        out += ["", f"## Simulated vs GPU ({gpu['_file']}, the {len(rows)} runs above)", ""]
        out += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], classes=None) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                    + "</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def to_html(results: Sequence[CaseResult], plots: dict[str, Path],
            necessity: Sequence[Sequence[str]] = (), gpu: dict[str, Any] | None = None) -> str:
    """One self-contained HTML page (plots embedded as base64 PNG)."""
    failed = sum(not r.ok for r in results)
    racy = [r for r in results if r.races]
    banner_cls = "bad" if failed else "ok"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>overlap-harness "
             f"summary</title><style>{CSS}</style></head><body>",
             "<h1>overlap-harness suite summary</h1>",
             f"<p class='banner {banner_cls}'>{len(results) - failed} passed, {failed} failed; "
             f"{len(racy)} runs with races: "
             + html.escape(", ".join(r.name for r in racy[:12]))
             + (" ..." if len(racy) > 12 else "") + "</p>",
             _table(HEAD, [_row(r) for r in results], [_css_class(r) for r in results])]
    if necessity:
        parts += ["<h2>Sync necessity</h2>", _table(
            ["scenario", "sync", "verdict", "races when removed", "manifest",
             "stall saved us", "idle saved us"], necessity),
                  f"<p>{html.escape(NECESSITY_LEGEND)}</p>"]
    parts.append("<h2>Racy, faulty and failing runs</h2>")
    for r in results:
        if needs_plot(r):
            parts.append(f"<h3 id='{html.escape(r.run_id)}'>{html.escape(r.name)}</h3>")
            if r.run_id in plots:
                parts.append(_img(plots[r.run_id]))
            parts.append(f"<pre>{html.escape(case_details(r))}</pre>")
    keys, rows = gpu_rows(gpu, results) if gpu else ([], [])
    if rows and gpu:
        parts.append(f"<h2>Simulated vs GPU ({html.escape(gpu['_file'])}, the {len(rows)} "
                     "runs above)</h2>")
        parts.append(_table(keys, rows))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
