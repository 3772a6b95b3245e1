"""Recount a committed GPU report of SGLang's loop from its own trial details (no GPU, nothing
run): the per-row counts a newer harness keeps (``slept_trials``, ``race_made_trials``,
``not_exercised``, ``repro``) and the computed whys, so an older report reads under today's
rules. Usage: ``python tools/sglang_gpu_recount.py reports/conformance/sglang-0.5.23-loop-gpu.json``
(rewrites the .json and its .md beside it).

With ``--earlier OLD.json``: a row the report's last run did not run (its deadline came first:
no trials) takes OLD's row of the same variant and site instead, where that one ran trials
under the same plan (CPU verdict, released races): the evidence an earlier device run left is
not lost because a later run, started to improve it, ran out of time. Each such row keeps the
device and torch it ran on, and the report's command says how many rows came so.

With ``--progress ROWS.jsonl --run "COMMAND"``: the rows a later device run finished before it
was stopped without writing its report (its ``gpu-rows.jsonl``, written as each child
finishes, a died or stopped child's rows too) replace the report's rows of the same variant
and site, a race row run again to go further keeping its earlier trials as the run itself
would (``--rerun`` names its ``--gpu-rerun`` mode); its twin-only rows add their twin trials
to the report's rows (gpu/twins.py). The report's command and ``runs`` name
that run, ``COMMAND`` as it was called.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

from overlap_harness.engines.sglang.gpu import report as gpu_report
from overlap_harness.engines.sglang.gpu.command import RERUN_MODES
from overlap_harness.engines.sglang.gpu.table import recounted


def with_earlier(rows: list[dict[str, Any]], earlier: dict[str, Any]
                 ) -> tuple[list[dict[str, Any]], int]:
    """``rows`` with each unrun row replaced by ``earlier``'s ran row of the same (variant,
    site) and plan; how many were replaced."""
    from overlap_harness.engines.sglang.gpu.command import earlier_in_place, ran_rows

    ran = ran_rows(earlier)
    out, taken = [], 0
    for row in rows:
        kept = earlier_in_place(row, ran, earlier)
        out.append(row if kept is None else kept)
        taken += kept is not None
    return out, taken


def with_progress(report: dict[str, Any], progress: list[dict[str, Any]], device: str,
                  torch_version: str, rerun: str) -> tuple[list[dict[str, Any]], int]:
    """``report``'s rows with each of ``progress``'s rows in place of the row of the same
    (variant, site) and its twin-only rows' twins added (each row names ``device`` and
    ``torch_version`` where it lacks them); how many rows of ``progress`` came in. As the
    device run itself would have (``gpu.command.with_earlier_trials``, its ``--gpu-rerun``
    mode ``rerun``), a race row run again to go further keeps the report's earlier trials
    beside the new ones."""
    from overlap_harness.engines.sglang.gpu import twins
    from overlap_harness.engines.sglang.gpu.command import with_earlier_trials

    kept, ran = twins.merged(report["rows"], progress)
    ran = with_earlier_trials([{"device": device, "torch": torch_version, **r} for r in ran],
                              report, rerun)
    fresh = {(r["variant"], r["site"]): r for r in ran}
    out = [fresh.pop((r["variant"], r["site"]), r) for r in kept]
    return out + list(fresh.values()), len(progress)


def main(argv: list[str] | None = None) -> None:
    """Rewrite the report (and the .md beside it) with every row recounted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--earlier", type=Path, help="an earlier report of the same tree: its "
                        "ran rows stand in for this one's unrun rows")
    parser.add_argument("--loop-json", type=Path, help="the loop report the rows were planned "
                        "from: each row of a variant in its released_races is marked "
                        "races_as_released (rows a run wrote before gpu.table._row kept the "
                        "mark lack it)")
    parser.add_argument("--progress", type=Path, help="a stopped device run's gpu-rows.jsonl: "
                        "its finished rows come in")
    parser.add_argument("--run", help="with --progress: that run's command, as called")
    parser.add_argument("--device", help="with --progress: the device it ran on")
    parser.add_argument("--torch", help="with --progress: its torch version")
    parser.add_argument("--seconds", type=float, help="with --progress: its wall seconds")
    parser.add_argument("--rerun", choices=RERUN_MODES,
                        default="unshown", help="with --progress: that run's --gpu-rerun "
                        "mode (which rows kept their earlier trials beside the new ones)")
    args = parser.parse_args(argv)
    if args.progress is not None and not (args.run and args.device and args.torch
                                          and args.seconds is not None):
        parser.error("--progress needs --run, --device, --torch and --seconds")
    report = json.loads(args.report.read_text())
    rows = report["rows"]
    command = report["command"]
    if args.progress is not None:
        progress = [json.loads(line) for line in args.progress.read_text().splitlines()
                    if line.strip()]
        rows, came = with_progress(report, progress, args.device, args.torch, args.rerun)
        note = (f"{args.run} (its report did not come back: its {came} rows with trials "
                "taken from its gpu-rows.jsonl by tools/sglang_gpu_recount.py --progress)")
        command += f"; then {note}"
        report.setdefault("runs", []).append({
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": note, "seconds": args.seconds})
        report["seconds"] += args.seconds
    released = json.loads(args.loop_json.read_text()).get("released_races", {}) \
        if args.loop_json is not None else {}

    def marked(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [dict(row, races_as_released=True) if released.get(row["variant"]) else row
                for row in rows]

    rows = marked(rows)
    if args.earlier is not None:
        earlier = json.loads(args.earlier.read_text())
        earlier["rows"] = marked(earlier["rows"])
        if earlier["sglang_version"] != report["sglang_version"]:
            parser.error(f"{args.earlier}: sglang {earlier['sglang_version']}, not "
                         f"{report['sglang_version']}")
        rows, taken = with_earlier(rows, earlier)
        command += (f"; then {taken} rows its deadline left unrun taken from the report before "
                    "it (tools/sglang_gpu_recount.py --earlier)")
    rows = [recounted(row) for row in rows]
    fresh = gpu_report.document(
        rows, version=report["sglang_version"], device=report["device"],
        torch_version=report["torch"], date=report["date"], command=command,
        failures=report["child_failures"], seconds=report["seconds"])
    for key in ("runs",):
        if key in report:
            fresh[key] = report[key]
    gpu_report.write(fresh, args.report.parent)
    print(json.dumps(fresh["summary"]))


if __name__ == "__main__":
    main()
