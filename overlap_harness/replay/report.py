"""The GPU suite report: replays as JSON-ready rows, a summary, and a Markdown page.

Pure data in, text out: :func:`run_row` turns one :class:`RunReplay` into the JSON row that
``tests/gpu_check/test_suite_report.py`` checks on CPU, :func:`summarize` gives the headline
figures and :func:`render_markdown` the page committed beside the JSON as
``reports/gpu/<date>-<device>.md``.

Race-free runs whose simulated values depend on the device (a read of never-written memory,
whose contents the caching allocator decides, or a scatter writing an element twice; see
:func:`overlap_harness.replay.plan.values_class`) are still replayed and their agreement counted,
but bit-identical agreement is not a property of such runs: they are reported as "values not
compared" and left out of the agreement criterion.

Racy runs carry a ``match_class`` (:func:`overlap_harness.replay.plan.racy_class`): ``exact`` runs
count the trials showing exactly the predicted values; "manifest-only: <reason>" runs (the
delayed prediction reads never-written memory or scatters an element twice; before the
block pool, a reuse race too) count the trials whose wrong values are at exactly the
predicted places (``same_keys``). Both need :data:`MATCH_TARGET` of their trials.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any

from overlap_harness.model.metrics import rel_err
from overlap_harness.model.opkeys import delays_from_json as parse_delays  # noqa: F401  (re-exported)
from overlap_harness.model.opkeys import delays_to_json
from overlap_harness.replay.plan import DETERMINISTIC, EXACT
from overlap_harness.replay.trials import TIMED, RunReplay, Tally

MATCH_TARGET = 0.95  # racy runs: at least 19 of 20 trials show exactly the predicted values


def device_slug(name: str) -> str:
    """The report file's device part: the model's word, ``"NVIDIA H100 80GB HBM3"`` ->
    ``"h100"``, ``"NVIDIA H200"`` -> ``"h200"``, ``"AMD Instinct MI300X"`` -> ``"mi300x"``;
    memory sizes and types (80GB, HBM3) are not models. Without one, the last word."""
    words = re.findall(r"[A-Za-z0-9]+", name)
    models = [w for w in words if re.fullmatch(r"[A-Za-z]{0,3}\d{2,4}[A-Za-z]{0,2}", w)
              and not re.fullmatch(r"\d+[GMT]B|HBM\d\w*|GDDR\d\w*", w, flags=re.IGNORECASE)]
    return (models[0] if models else words[-1] if words else "gpu").lower()


def tally_dict(t: Tally) -> dict[str, Any]:
    """One schedule's counts as JSON."""
    return {"delays_us": delays_to_json(t.delays), "trials": t.trials, "equal": t.equal,
            "same_diffs": t.same_diffs, "same_keys": t.same_keys, "equal_oracle": t.equal_oracle,
            "manifest": t.manifest, "verdicts": dict(t.verdicts), "errors": t.errors,
            "first_mismatch": t.first_mismatch, "metrics_median": t.median_metrics(),
            "gates": t.gates, "gates_unset": t.gates_unset, "gate_timeouts": t.gate_timeouts}


def timing_dict(r: RunReplay) -> dict[str, Any] | None:
    """Per metric: simulated (launch cost as measured), simulated as the scenario is written,
    the device's median, and the relative error of the first."""
    dev = r.main.median_metrics()
    sim = r.sim_metrics()
    if dev is None or sim is None:
        return None
    written = r.plan.sim_as_written
    out: dict[str, Any] = {}
    for k in TIMED:
        s = getattr(sim, k)
        out[k] = {"sim": s, "sim_as_written": None if written is None else getattr(written, k),
                  "gpu": dev[k], "rel_err": rel_err(s, dev[k])}
    return out


def run_row(r: RunReplay) -> dict[str, Any]:
    """One run of the suite as a report row."""
    p = r.plan
    row: dict[str, Any] = {
        "run_id": p.spec.run_id, "scenario": p.spec.scenario.name,
        "mutation": p.spec.mutation_name or "base", "expect": str(p.spec.expect),
        "kind": p.kind, "sim_verdict": p.sim_verdict, "error": p.error,
        "gpu_verdicts": dict(r.main.verdicts), "main": tally_dict(r.main),
        "timing": timing_dict(r), "csan": r.csan,
        "uninit_reads": p.uninit_reads, "dup_writes": p.dup_writes,
        "values_class": p.values_class,
    }
    if p.kind == "race_free":
        row["agreement"] = r.agreement
        row["values_compared"] = r.compared
    if p.kind == "racy":
        row["schedule"] = {"source": p.schedule_source,
                           "explore_delays_us": delays_to_json(p.explore_delays or {}),
                           "delays_us": delays_to_json(p.delays), "tight_pairs_left": p.tight_left,
                           "margin_us": round(p.margin_us, 1),
                           "narrowest_gap_us": p.narrowest_gap_us, "capped": p.capped,
                           "inverted_pairs": p.inverted_pairs, "gates": len(p.gates),
                           "gates_dropped": p.gates_dropped}
        row["predicted_diffs"] = p.predicted_diffs
        row["predicted_uninit_reads"] = p.predicted_uninit_reads
        row["predicted_dup_writes"] = p.predicted_dup_writes
        row["predicted_race_kinds"] = p.predicted_race_kinds
        row["match_class"] = p.match_class
        row["match"] = r.main.equal
        row["hits"] = r.hits
        row["baseline"] = None if r.baseline is None else tally_dict(r.baseline)
    return row


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Headline figures over the report rows."""
    every_free = [r for r in rows if r["kind"] == "race_free"]
    free = [r for r in every_free if compared(r)]
    unc = [r for r in every_free if not compared(r)]
    racy = [r for r in rows if r["kind"] == "racy"]
    tr = sum(r["main"]["trials"] for r in free)
    agree = sum(_agreeing(r) for r in free)
    good = [r for r in racy if at_target(r, match_class(r))]
    exact = [r for r in racy if match_class(r) == EXACT]
    mo = [r for r in racy if match_class(r) != EXACT]
    errs: dict[str, list[float]] = {k: [] for k in TIMED}
    for r in rows:
        for k, v in (r["timing"] or {}).items():
            if v["rel_err"] is not None:
                errs[k].append(abs(v["rel_err"]))
    return {
        "runs": len(rows), "race_free_runs": len(every_free), "racy_runs": len(racy),
        "error_runs": sum(r["kind"] == "error" for r in rows),
        "race_free_runs_compared": len(free),
        "race_free_trials": tr, "race_free_trials_agreeing": agree,
        "race_free_agreement_pct": round(100 * agree / tr, 2) if tr else None,
        "race_free_runs_all_agreeing": sum(bool(r["agreement"]) for r in free),
        "values_not_compared": {r["run_id"]: {"class": r["values_class"],
                                              "agreeing": _agreeing(r),
                                              "trials": r["main"]["trials"]} for r in unc},
        "racy_trials": sum(r["main"]["trials"] for r in racy),
        "racy_trials_matching": sum(r["match"] for r in racy),
        "racy_runs_at_target": len(good),
        "racy_exact_runs": len(exact),
        "racy_exact_at_target": sum(r in good for r in exact),
        "racy_exact_trials": sum(r["main"]["trials"] for r in exact),
        "racy_exact_trials_matching": sum(r["match"] for r in exact),
        "racy_manifest_only": {r["run_id"]: {"class": match_class(r),
                                             "manifest_at_places": r["main"]["same_keys"],
                                             "exact": r["match"],
                                             "trials": r["main"]["trials"]} for r in mo},
        "racy_manifest_only_at_target": sum(r in good for r in mo),
        "baseline_trials": sum(r["baseline"]["trials"] for r in racy if r["baseline"]),
        "baseline_manifest": sum(r["baseline"]["manifest"] for r in racy if r["baseline"]),
        "timing_median_abs_rel_err": {k: round(statistics.median(v), 3) if v else None
                                      for k, v in errs.items()},
        "csan": dict(_count(r["csan"]["verdict"] for r in rows if r.get("csan"))),
        "csan_vs_ours": dict(_count(f"{r['sim_verdict']} / {r['csan']['verdict']}"
                                    for r in rows if r.get("csan"))),
    }


def compared(row: dict[str, Any]) -> bool:
    """A race-free row whose values are held to bit-identical agreement (the rows written
    before ``values_class`` existed count as compared)."""
    return row["kind"] == "race_free" and row.get("values_class", DETERMINISTIC) == DETERMINISTIC


def match_class(row: dict[str, Any]) -> str:
    """A racy row's class (the rows written before ``match_class`` existed are exact)."""
    return row.get("match_class") or EXACT


def hits(row: dict[str, Any], cls: str) -> int:
    """A racy row's trials that count under class ``cls``: exact values, or wrong values at
    the predicted places (manifest-only)."""
    return row["match"] if cls == EXACT else row["main"]["same_keys"]


def at_target(row: dict[str, Any], cls: str) -> bool:
    """A racy row reaches :data:`MATCH_TARGET` under class ``cls``."""
    n = row["main"]["trials"]
    return bool(n) and hits(row, cls) >= MATCH_TARGET * n


def _agreeing(row: dict[str, Any]) -> int:
    return min(row["main"]["equal"], row["main"]["equal_oracle"])


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def passed(summary: dict[str, Any]) -> bool:
    """Every compared race-free run agrees in every trial; every racy run reaches the
    target."""
    return (summary["race_free_runs_all_agreeing"] == summary["race_free_runs_compared"]
            and summary["racy_runs_at_target"] == summary["racy_runs"])


def _frac(k: int, n: int) -> str:
    return f"{k}/{n}" if n else "-"


def _err(t: dict[str, Any] | None, key: str) -> str:
    if not t:
        return "-"
    v = t[key]
    e = "-" if v["rel_err"] is None else f"{100 * v['rel_err']:+.0f}%"
    return f"{v['sim'] / 1000:.0f}/{v['gpu'] / 1000:.0f} ({e})"


def _verdicts(c: dict[str, int]) -> str:
    return ", ".join(f"{k}×{n}" if n > 1 else k for k, n in sorted(c.items())) or "-"


# The value replay issues every op through the harness (protocol model, recorder, timing
# events, staging, gates: 100-450 µs of host time an op), so its timing against the simulator
# measures that overhead, not the model; the timing evidence is the timing replay's.
OVERHEAD_LABEL = ("- value replay's timing against the simulator (the harness's own per-op "
                  "overhead, not the model's error), median |relative error|: ")
CALIBRATION_POINTER = ("the model's timing error is measured by the timing replay against a "
                       "device profile: docs/calibration.md")


def render_markdown(report: dict[str, Any]) -> str:
    """The report page: where and how it ran, the headline figures, one row per run."""
    s = report["summary"]
    lines = [
        "# The suite on real CUDA streams: differential replay against the simulator", "",
        f"- device: {report['device']}", f"- driver: {report['driver']}",
        f"- torch: {report['torch']} (CUDA {report['cuda']}), Python {report['python']}",
        f"- date: {report['date']}", f"- command: `{report['command']}`",
        f"- trials: {report['trials']} a schedule; host launch cost measured "
        f"{report['host_launch_us']:.1f} µs (the simulations below use it); `_sleep` "
        f"{report['calibration']['cycles_per_us']:.1f} cycles/µs; delay floor "
        f"{report['floor_us']:.0f} µs; racing accesses widened to "
        + report.get("gap_rule", f"{report.get('min_gap_us', 0):.0f} µs"),
        "- racy runs' trials "
        + ("are gated: every racing pair is held to the order the delayed simulation ran it "
           "(`overlap_harness/replay/gates.py`, `gpu_check/flags.py`; out of the trace)"
           if report.get("gated") else "rely on the delays alone (no gates)"),
        f"- data: `{report['json_name']}` (same folder)", "",
        "## Headline", "",
        f"- race-free runs whose values are compared: {s['race_free_runs_all_agreeing']}/"
        f"{s['race_free_runs_compared']} agree in every trial; "
        f"{s['race_free_trials_agreeing']}/{s['race_free_trials']} trials bit-identical to "
        f"the simulator and the oracle ({s['race_free_agreement_pct']}%)",
        f"- race-free runs whose values are device-defined (not compared): "
        f"{len(s['values_not_compared'])} of {s['race_free_runs']}" + "".join(
            f"; {rid.split('-')[0]} {v['agreeing']}/{v['trials']}"
            for rid, v in s["values_not_compared"].items()),
        f"- racy runs under injected delays: {s['racy_runs_at_target']}/{s['racy_runs']} at "
        f"≥{MATCH_TARGET:.0%}; {s['racy_trials_matching']}/{s['racy_trials']} trials show "
        "exactly the predicted values",
        f"- racy runs judged exact: {s.get('racy_exact_at_target', '-')}/"
        f"{s.get('racy_exact_runs', '-')} at target; {s.get('racy_exact_trials_matching', '-')}"
        f"/{s.get('racy_exact_trials', '-')} trials exactly the predicted values",
        "- racy runs judged manifest-only (device-defined values in the prediction): "
        f"{s.get('racy_manifest_only_at_target', '-')}/"
        f"{len(s.get('racy_manifest_only', {}))} at target" + "".join(
            f"; {rid.split('-')[0]} {v['manifest_at_places']}/{v['trials']} (exact "
            f"{v['exact']})" for rid, v in s.get("racy_manifest_only", {}).items()),
        f"- racy runs without delays (baseline): {s['baseline_manifest']}/"
        f"{s['baseline_trials']} trials show wrong values",
        OVERHEAD_LABEL + ", ".join(
            f"{k} {v:.0%}" if v is not None else f"{k} -"
            for k, v in s["timing_median_abs_rel_err"].items())
        + "; " + CALIBRATION_POINTER,
    ]
    if s["csan"]:
        lines.append("- CSAN verdicts: " + _verdicts(s["csan"]))
        lines.append("- ours / CSAN: " + _verdicts(s["csan_vs_ours"]))
    if report.get("not_replayed"):
        lines.append(f"- NOT replayed (deadline): {len(report['not_replayed'])} runs: "
                     + ", ".join(report["not_replayed"]))
    lines += ["", "## Runs", "",
              "Values: trials equal to the simulated run (race-free) or to the prediction "
              "under the delays (racy). Times: µs per iteration, host stall, forward idle as "
              "sim/GPU (relative error) in this value replay, whose GPU times include the "
              "harness's own per-op overhead; " + CALIBRATION_POINTER + ".", "",
              "| run | expect | sim | GPU detector | values | baseline wrong | iteration "
              "| host stall | fwd idle | CSAN |", "| --- " * 10 + "|"]
    for r in report["runs"]:
        m = r["main"]
        vals = _frac(min(m["equal"], m["equal_oracle"]) if r["kind"] == "race_free"
                     else hits(r, match_class(r)), m["trials"]) if r["kind"] != "error" else "-"
        if r["kind"] == "race_free" and not compared(r):
            vals += " (not compared)"
        if r["kind"] == "racy" and match_class(r) != EXACT:
            vals += f" (manifest-only; exact {m['equal']})"
        base = _frac(r["baseline"]["manifest"], r["baseline"]["trials"]) \
            if r.get("baseline") else "-"
        csan = r["csan"]["verdict"] if r.get("csan") else "-"
        t = r["timing"]
        lines.append(f"| {r['scenario']}[{r['mutation']}] | {r['expect']} | {r['sim_verdict']} "
                     f"| {_verdicts(r['gpu_verdicts'])} | {vals} | {base} "
                     f"| {_err(t, 'iteration_ns')} | {_err(t, 'host_stall_ns')} "
                     f"| {_err(t, 'forward_idle_ns')} | {csan} |")
    unc = [r for r in report["runs"] if r["kind"] == "race_free" and not compared(r)]
    if unc:
        lines += ["", "## Values not compared", "",
                  "Race-free runs whose simulated values depend on the device: bit-identical "
                  "agreement is not a property of such runs (replayed and counted above, left "
                  "out of the agreement criterion).", ""]
        for r in unc:
            why = (r.get("uninit_reads") or []) + (r.get("dup_writes") or [])
            lines.append(f"- {r['run_id']}: {r['values_class']}: " + "; ".join(why)[:300])
    mo = [r for r in report["runs"] if r["kind"] == "racy" and match_class(r) != EXACT]
    if mo:
        lines += ["", "## Racy runs judged on manifestation", "",
                  "The delayed prediction's values are partly the device's (never-written "
                  "memory, a duplicate-index scatter): a trial counts when it differs from "
                  "the oracle at exactly the predicted places (what, iteration, request), "
                  "whatever the values there.", ""]
        for r in mo:
            why = (r.get("predicted_uninit_reads") or []) + (r.get("predicted_dup_writes") or [])
            lines.append(f"- {r['run_id']}: {match_class(r)}: "
                         f"{r['main']['same_keys']}/{r['main']['trials']} at the predicted "
                         f"places, {r['match']} exact; " + "; ".join(why)[:300])
    bad = [r for r in report["runs"] if r["kind"] != "error"
           and (r["main"]["errors"] or r["main"]["first_mismatch"])]
    if bad:
        lines += ["", "## Mismatches and errors", ""]
        for r in bad:
            what = r["main"]["errors"] or r["main"]["first_mismatch"]
            lines.append(f"- {r['run_id']}: " + "; ".join(what)[:400])
    return "\n".join(lines) + "\n"
