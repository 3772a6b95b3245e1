"""Predicted against measured: a profile's replay costs held to a ``gpu-check`` report.

Every run of the report that has measured timing is simulated again on
``sim.profiled.ProfiledSimDevice`` with the profile's *replay* costs
(:data:`model.profile.Mode.REPLAY`: what the harness's ``CudaDevice`` replay costs, since that
replay is what the report measured), under the same delays the GPU trials ran (racy runs:
the plan's delays in the row), and its iteration time, host stall and forward idle are set
beside the device's medians. The summary gives, per metric, the median and the worst
|relative error| over the runs and whether they meet the targets (:data:`MEDIAN_TARGET`,
:data:`WORST_TARGET`); the report's own simulated column (the model before profiles) is
kept beside for comparison.

A run whose measured value is 0 has no relative error (it is listed, not counted).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import compute_metrics, rel_err
from overlap_harness.model.opkeys import delays_from_json
from overlap_harness.model.profile import Mode, Profile, costs_from_profile, load_profile
from overlap_harness.reports.calibration_plot import write_plot
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths
from overlap_harness.sim.profiled import simulate_profiled

METRICS = ("iteration_ns", "host_stall_ns", "forward_idle_ns")
MEDIAN_TARGET = 0.10
WORST_TARGET = 0.25


def predict_run(spec: RunSpec, profile: Profile,
                delays: Mapping[tuple[str, int], float]) -> dict[str, int]:
    """The metrics of one run predicted with the profile's replay costs."""
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    costs = costs_from_profile(profile, scenario.timing, Mode.REPLAY)
    scenario = dataclasses.replace(scenario, timing=costs.timing)
    _, dev = simulate_profiled(scenario, spec.removed, costs, delays)
    m = compute_metrics(dev.finish().timeline)
    return {k: getattr(m, k) for k in METRICS}


def predict_report(report: Mapping[str, Any], profile: Profile,
                   specs: Mapping[str, RunSpec]) -> list[dict[str, Any]]:
    """One row per run of ``report`` with measured timing: per metric the prediction, the
    measurement, the relative error, and the report's own simulation (``before``).

    Raises:
        HarnessError: a run of the report is not among ``specs`` (wrong scenario paths).
    """
    rows = []
    for run in report["runs"]:
        timing = run.get("timing")
        if not timing:
            continue
        spec = specs.get(run["run_id"])
        if spec is None:
            raise HarnessError(f"run {run['run_id']} of the report is not in the scenarios "
                               "given; pass the paths the report ran")
        delays = delays_from_json(run["main"]["delays_us"]) if run["kind"] == "racy" else {}
        predicted = predict_run(spec, profile, delays)
        metrics = {}
        for k in METRICS:
            measured = timing[k]["gpu"]
            metrics[k] = {"predicted": predicted[k], "measured": measured,
                          "rel_err": rel_err(predicted[k], measured),
                          "before": timing[k]["sim"],
                          "before_rel_err": rel_err(timing[k]["sim"], measured)}
        rows.append({"run_id": run["run_id"], "kind": run["kind"], "metrics": metrics})
    return rows


def repeat_spread(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The measurement's own noise: runs of one configuration (the same run-id hash: the
    same protocol, workload and syncs, in different scenario files) were measured apart; per
    metric, the median and worst |measured / the group's median - 1| over those runs. No
    prediction can be held closer than this."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["run_id"].rpartition("-")[2], []).append(r)
    repeated = [g for g in groups.values() if len(g) > 1]
    out: dict[str, Any] = {"groups": len(repeated), "runs": sum(len(g) for g in repeated)}
    for k in METRICS:
        devs = []
        for g in repeated:
            mid = statistics.median(r["metrics"][k]["measured"] for r in g)
            devs += [abs(r["metrics"][k]["measured"] / mid - 1) for r in g if mid]
        out[k] = {"median": round(statistics.median(devs), 4) if devs else None,
                  "max": round(max(devs), 4) if devs else None}
    return out


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per metric: runs counted, median and worst |relative error| (predicted and before),
    runs within 10%; ``targets_met`` when every metric's median <= 10% and worst <= 25%."""
    out: dict[str, Any] = {}
    met = True
    for k in METRICS:
        errs = [abs(r["metrics"][k]["rel_err"]) for r in rows
                if r["metrics"][k]["rel_err"] is not None]
        before = [abs(r["metrics"][k]["before_rel_err"]) for r in rows
                  if r["metrics"][k]["before_rel_err"] is not None]
        med = round(statistics.median(errs), 4) if errs else None
        worst = round(max(errs), 4) if errs else None
        out[k] = {"runs": len(errs), "median_abs_rel_err": med, "max_abs_rel_err": worst,
                  "within_10pct": sum(e <= 0.10 for e in errs),
                  "before_median_abs_rel_err": round(statistics.median(before), 4)
                  if before else None}
        met = met and med is not None and med <= MEDIAN_TARGET and worst <= WORST_TARGET
    out["targets_met"] = met
    out["repeat_spread"] = repeat_spread(rows)
    return out


def summary_line(summary: Mapping[str, Any]) -> str:
    """The one-line summary: each metric's median and worst error, and the verdict."""
    parts = [f"{k.removesuffix('_ns')} median {100 * v['median_abs_rel_err']:.1f}% worst "
             f"{100 * v['max_abs_rel_err']:.1f}% ({v['within_10pct']}/{v['runs']} within 10%)"
             for k in METRICS if (v := summary[k])["median_abs_rel_err"] is not None]
    verdict = "targets met" if summary["targets_met"] else \
        f"targets missed (median <= {MEDIAN_TARGET:.0%}, worst <= {WORST_TARGET:.0%})"
    return "; ".join(parts) + f"; {verdict}"


def pct(x: float | None) -> str:
    """A relative error as a signed percentage, "-" when there is none."""
    return "-" if x is None else f"{100 * x:+.1f}%"


def render_markdown(doc: Mapping[str, Any]) -> str:
    """The page: which report and profile, the summary line, one row per run."""
    s = doc["summary"]
    lines = [
        "# Predicted against measured: a device profile held to a GPU report", "",
        f"- report: `{doc['report']}` ({doc['report_device']}, {doc['report_date']})",
        f"- profile: `{doc['profile']}` (measured on {doc['profile_device']}, "
        f"{doc['profile_date']})",
        f"- command: `{doc['command']}`",
        "- prediction: the profile's replay costs (harness host cost per call kind and per op, "
        "extra GPU time per op) on `sim.profiled.ProfiledSimDevice`, the runs' GPU delays",
        f"- plot: `{doc['plot']}`", "",
        "## Summary", "", f"**{summary_line(s)}**", "",
        "| metric | runs | median abs err | worst abs err | within 10% | before (report's sim) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for k in METRICS:
        v = s[k]
        lines.append(f"| {k} | {v['runs']} | {pct(v['median_abs_rel_err'])} "
                     f"| {pct(v['max_abs_rel_err'])} | {v['within_10pct']} "
                     f"| {pct(v['before_median_abs_rel_err'])} |")
    rs = s.get("repeat_spread")
    if rs and rs["groups"]:
        lines += ["", f"Noise floor: {rs['runs']} runs in {rs['groups']} groups share a "
                  "configuration (same run-id hash) and were measured apart; their |measured / "
                  "group median - 1|: " + ", ".join(
                      f"{k.removesuffix('_ns')} median {pct(rs[k]['median'])}, worst "
                      f"{pct(rs[k]['max'])}" for k in METRICS) + "."]
    lines += runs_table(doc["rows"], "µs predicted / measured (relative error).",
                        lambda m: f"{m['predicted'] / 1000:.0f} / {m['measured'] / 1000:.0f} "
                                  f"({pct(m['rel_err'])})")
    return "\n".join(lines) + "\n"


def runs_table(rows: Sequence[Mapping[str, Any]], legend: str,
               cell: Callable[[Mapping[str, Any]], str]) -> list[str]:
    """A page's "Runs" section: one row per run, ``cell`` of each metric's figures."""
    lines = ["", "## Runs", "", legend, "",
             "| run | kind | iteration | host stall | forward idle |", "| --- " * 5 + "|"]
    for r in rows:
        cells = [cell(r["metrics"][k]) for k in METRICS]
        lines.append(f"| {r['run_id']} | {r['kind']} | " + " | ".join(cells) + " |")
    return lines


def read_json_document(path: Path, what: str) -> Any:
    """A JSON file's document; a file that cannot be read or parsed is a one-line
    :class:`HarnessError` naming ``what`` it should have been."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"{path}: cannot read {what}: {exc}") from None


def compare_command(report_path: str, profile_path: str, paths: Sequence[str],
                    out_dir: str | None) -> int:
    """``calibrate --compare``: write ``<report>-vs-<profile>.json|md|png``; 0 when the
    targets are met, 1 otherwise.

    Raises:
        HarnessError: the report cannot be read, or a run of it is not in ``paths``.
        ProfileError: the profile is bad.
    """
    profile = load_profile(profile_path)
    rp = Path(report_path)
    report = read_json_document(rp, "the GPU report")
    if not isinstance(report, dict) or "runs" not in report:
        raise HarnessError(f"{rp}: not a gpu-check report (no 'runs')")
    specs = {s.run_id: s for sc in load_paths(paths) for s in expand(sc)}
    rows = predict_report(report, profile, specs)
    summary = summarize(rows)
    out = Path(out_dir) if out_dir else rp.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{rp.stem}-vs-{Path(profile_path).stem}"
    plot = write_plot(rows, out / f"{stem}.png",
                      f"{report.get('device', '?')} measured vs predicted with "
                      f"{Path(profile_path).name}")
    doc = {"kind": "profile-check", "report": rp.name, "report_device": report.get("device"),
           "report_date": report.get("date"), "profile": Path(profile_path).name,
           "profile_device": profile.device, "profile_date": profile.meta["date"],
           "command": f"overlap-harness calibrate --compare {report_path} --profile "
                      f"{profile_path} {' '.join(paths)}",
           "plot": plot.name, "summary": summary, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(render_markdown(doc), encoding="utf-8")
    print(summary_line(summary))
    print(f"wrote {out / stem}.json, .md and .png", file=sys.stderr)
    return 0 if summary["targets_met"] else 1
