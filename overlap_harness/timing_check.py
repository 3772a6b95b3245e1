"""The timing check: the bundled suite replayed as prebuilt op lists, predicted against measured.

Three steps, the first two on a GPU:

- :func:`fit_timing_group`: replay the calibration workloads (``profiles/calibration/``, none
  of them in the suite) with :mod:`gpu_check.timing_replay` and read the profile's ``timing``
  group off them (:func:`model.op_list.timing_costs`); given the suite, its runs are
  replayed in the same rounds (and not fitted on);
- :func:`measure_suite`: every run of the suite replayed ``repeats`` times in interleaved
  rounds (each round replays every run once; docs/calibration.md says why), keeping per
  replay the metrics :func:`model.metrics.compute_metrics` computes on its measured
  timeline (the simulator's definitions, the same code);
- :func:`compare` (CPU): predict every run with a profile's SYSTEM costs on
  ``sim.profiled.ProfiledSimDevice`` and set the prediction beside the median of the
  replays, with the replays' own spread (the noise floor) and the bundled default model
  (``before``); page, JSON and plot (:mod:`overlap_harness.profile_check`'s summary).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.model.config import Expect
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.metrics import compute_metrics
from overlap_harness.model.op_list import (
    Replay,
    ReplayCall,
    TimingSamples,
    after_wait,
    measured_timeline,
    replays_to_data,
    return_costs,
    timing_costs,
)
from overlap_harness.model.profile import (
    Figure,
    Mode,
    Profile,
    TimingGroup,
    costs_from_profile,
    load_profile,
)
from overlap_harness.model.trace import OpRecord
from overlap_harness.profile_check import (
    METRICS,
    WORST_TARGET,
    pct,
    read_json_document,
    rel_err,
    runs_table,
    summarize,
    summary_line,
)
from overlap_harness.reports.calibration_plot import write_plot
from overlap_harness.runner import simulate
from overlap_harness.scenarios.expand import RunSpec, expand
from overlap_harness.scenarios.loader import load_paths
from overlap_harness.sim.op_capture import capture_op_list
from overlap_harness.sim.profiled import simulate_profiled, start_gap_delays

MEASUREMENT_KIND = "timing-measurement"
CHECK_KIND = "timing-check"
#: Rounds replayed and discarded before the measured ones (the first replay of a list pays
#: for cold caches and lazy CUDA setup).
WARMUP_ROUNDS = 1
#: The order of measurements made before the rounds (a run's replays one after the other).
CONSECUTIVE = "consecutive: each run's replays in one profiler session"
#: How the measurement orders the replays (stated in the measurement and on the page).
ORDER = ("interleaved rounds: each round replays every run once, in an order rotated and, "
         "every other round, reversed; one warm-up round discarded")


def suite_specs(paths: Sequence[str]) -> list[RunSpec]:
    """Every run of the scenarios at ``paths`` that runs (runs expected to be refused left
    out: they issue nothing)."""
    return [s for sc in load_paths(paths) for s in expand(sc) if s.expect != Expect.ERROR]


def op_list(spec: RunSpec) -> list[ReplayCall]:
    """The run's op list, captured from the simulator."""
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    return capture_op_list(scenario, spec.removed)[0]


def run_kind(spec: RunSpec) -> str:
    """``racy`` or ``race_free`` (the plot's markers)."""
    return "racy" if spec.expect == Expect.RACE else "race_free"


def metrics_of(replay: Replay) -> dict[str, int]:
    """The metrics of one measured replay."""
    m = compute_metrics(measured_timeline(*replay))
    return {k: getattr(m, k) for k in METRICS}


# -- GPU steps ---------------------------------------------------------------------------------

def _interleaved(specs: Sequence[RunSpec], cycles_per_us: float, rounds: int,
                 log: Callable[[str], None] | None = None) -> list[list[Replay]]:
    """Every run of ``specs`` replayed once per round, ``rounds`` interleaved rounds after one
    discarded warm-up round (:func:`gpu_check.timing_replay.replay_rounds`); per run its
    replays."""
    # deferred: needs torch.cuda; the CPU steps of this module import no GPU code
    from overlap_harness.gpu_check.timing_replay import replay_rounds

    lists = [op_list(spec) for spec in specs]
    measured = replay_rounds(lists, cycles_per_us, rounds, WARMUP_ROUNDS, log)
    return [[(calls, stamps, spans) for stamps, spans in replays]
            for calls, replays in zip(lists, measured, strict=True)]


def kernel_call_us(replay: Replay) -> float | None:
    """The median host time of one replay's kernel calls, µs (the host's speed in that
    replay; None without kernels)."""
    calls, stamps, _ = replay
    spans = [stamps[i + 1] - stamps[i] for i, c in enumerate(calls) if c.kind == "kernel"]
    return round(statistics.median(spans) / 1000, 2) if spans else None


def group_from_samples(samples: TimingSamples, fitted_on: str,
                       call_means: Mapping[str, float] | None = None) -> TimingGroup:
    """The timing group's figures from pooled samples (kinds without samples left out);
    ``call_means``, when given, replaces the pooled means of the calls' host times as the
    means charged (:func:`typical_call_means`)."""
    def fig(values: Sequence[float]) -> Figure:
        return Figure.of(values) if values else Figure(0.0, 0.0, 0.0, 1)

    pooled = [x for v in samples.kernel_extra_us.values() for x in v]
    summed = {"sync_wake": samples.sync_wake_us, "start_gap": samples.start_gap_us,
              "wait_gap": samples.wait_gap_us}
    figures = {"kernel_extra": fig(pooled), "sync_idle": fig(samples.sync_idle_us),
               "start_lag": fig(samples.start_lag_us)} | {k: fig(v) for k, v in summed.items()}
    call_means = {k: statistics.fmean(v) for k, v in samples.call_us.items() if v}
    returns = return_costs(samples.after_wait, call_means)
    for kind in ("sync", "copy"):
        figures[f"{kind}_return"] = fig(returns.get(kind, []))
        summed[f"{kind}_return"] = returns.get(kind, [])
    means = {k: round(statistics.fmean(v), 4) for k, v in (samples.call_us | summed).items()
             if v} | {k: round(v, 4) for k, v in (call_means or {}).items()}
    return TimingGroup({k: Figure.of(v) for k, v in samples.call_us.items() if v}, figures,
                       {k: Figure.of(v) for k, v in samples.kernel_extra_us.items() if v},
                       {k: Figure.of(v) for k, v in samples.copy_us.items() if v}, fitted_on,
                       means, {k: round(statistics.fmean(v), 4)
                               for k, v in samples.gap_by_op_us.items() if v},
                       {k: round(statistics.fmean(v), 4)
                        for k, v in samples.gap_by_transition_us.items() if v})


def fit_timing_group(paths: Sequence[str], cycles_per_us: float, repeats: int = 3,
                     suite: Sequence[str] = (), log: Callable[[str], None] | None = None,
                     ) -> tuple[TimingGroup, list[tuple[str, list[Replay]]], list[list[Replay]]]:
    """The timing group, from timing replays of the calibration workloads at ``paths``
    (``repeats`` interleaved rounds), those replays by run id (``calibrate --refit-timing``
    fits them again on a CPU), and the replays of the runs at ``suite`` (empty when none).

    The suite's runs, when given, are replayed in the same rounds as the calibration
    workloads, so the host the profile is fitted on is the host the suite is measured on
    (its speed moves within a lease: docs/calibration.md); only the calibration workloads'
    replays are fitted on.
    """
    calibration, held_out = suite_specs(paths), suite_specs(suite) if suite else []
    replays = _interleaved([*calibration, *held_out], cycles_per_us, repeats, log)
    runs = [(spec.run_id, rs) for spec, rs in zip(calibration, replays, strict=False)]
    together = f", in the same rounds as {', '.join(suite)}" if suite else ""
    group = group_from_runs(runs, f"timing replays of {', '.join(paths)} ({repeats} a run, "
                                  f"interleaved rounds{together})")
    return group, runs, replays[len(calibration):]


def typical_call_means(replays: Sequence[Replay]) -> dict[str, float]:
    """Per call kind, the median over ``replays`` of each replay's mean host time of that
    kind's calls.

    The host's speed moves within a lease (kernel calls about 7 or about 12 µs for
    stretches of a second, docs/calibration.md), so a pooled mean is a mix of the states the
    calibration happened to meet. The measurement holds a run to the median of its replays;
    the mean charged is taken the same way: the mean of a typical replay.
    """
    per_replay: dict[str, list[float]] = {}
    for replay in replays:
        for kind, values in timing_costs([replay]).call_us.items():
            if values:
                per_replay.setdefault(kind, []).append(statistics.fmean(values))
    return {kind: statistics.median(v) for kind, v in per_replay.items()}


def group_from_runs(runs: Sequence[tuple[str, Sequence[Replay]]], fitted_on: str,
                    ) -> TimingGroup:
    """The timing group fitted on measured replays (:func:`group_from_samples`), the calls'
    means those of a typical replay (:func:`typical_call_means`)."""
    replays = [r for _, rs in runs for r in rs]
    return group_from_samples(timing_costs(replays), f"{fitted_on}, {len(replays)} replays",
                              typical_call_means(replays))


def measure_suite(paths: Sequence[str], cycles_per_us: float, repeats: int,
                  meta: Mapping[str, str], log: Callable[[str], None] = print,
                  raw: list[tuple[str, list[Replay]]] | None = None,
                  measured: Sequence[Sequence[Replay]] | None = None) -> dict[str, Any]:
    """Every run of the suite replayed ``repeats`` times, in ``repeats`` interleaved rounds
    (each round replays every run once, in a rotated order) after a discarded warm-up round:
    the measurement document (per run its replays' metrics, in round order, and each replay's
    median kernel call time); the replays themselves are appended to ``raw`` when given.
    ``measured``: the runs' replays already made (:func:`fit_timing_group` with ``suite``)."""
    specs = suite_specs(paths)
    if measured is None:
        measured = _interleaved(specs, cycles_per_us, repeats, log)
    runs = []
    for spec, replays in zip(specs, measured, strict=True):
        if raw is not None:
            raw.append((spec.run_id, replays))
        runs.append({"run_id": spec.run_id, "kind": run_kind(spec), "calls": len(replays[0][0]),
                     "repeats": [metrics_of(r) for r in replays],
                     "kernel_call_us": [kernel_call_us(r) for r in replays]})
    return {"kind": MEASUREMENT_KIND, **meta, "paths": list(paths), "repeats": repeats,
            "order": ORDER, "warmup_rounds": WARMUP_ROUNDS,
            "cycles_per_us": cycles_per_us, "runs": runs}


# -- CPU: predicted against measured -----------------------------------------------------------

def predict(spec: RunSpec, profile: Profile) -> dict[str, int]:
    """The metrics of one run predicted with the profile (:func:`predicted_timeline`)."""
    m = compute_metrics(predicted_timeline(spec, profile))
    return {k: getattr(m, k) for k in METRICS}


def predicted_timeline(spec: RunSpec, profile: Profile) -> list[OpRecord]:
    """The simulated timeline of one run with the profile's SYSTEM costs (its timing group's
    GPU start gaps charged as start delays: the wait gap for the first kernel or copy after a
    wait on its stream, the gap of its transition (``kernel->copy``...) for the others)."""
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    costs = costs_from_profile(profile, scenario.timing, Mode.SYSTEM)
    scenario = dataclasses.replace(scenario, timing=costs.timing)
    delays: dict[tuple[str, int], float] = {}
    calls = op_list(spec)
    gpu, waits = [c for c in calls if c.on_gpu], after_wait(calls)
    for c, (waited, transition) in zip(gpu, waits, strict=True):
        gap = costs.wait_gap_us if waited else \
            costs.gap_by_transition_us.get(transition, costs.start_gap_us)
        delays = start_gap_delays([(c.name, c.iteration)], gap, delays)
    _, dev = simulate_profiled(scenario, spec.removed, costs, delays or None,
                               values="issue_order")
    return dev.finish().timeline


def default_model(spec: RunSpec) -> dict[str, int]:
    """The metrics the bundled default model (no profile) gives the run."""
    scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
    _, dev = simulate(scenario, spec.removed, jitter=0.0, values="issue_order")
    m = compute_metrics(dev.finish().timeline)
    return {k: getattr(m, k) for k in METRICS}


def spread(values: Sequence[float]) -> float | None:
    """max |value / median - 1| over one run's replays (None when the median is 0)."""
    mid = statistics.median(values)
    return None if mid == 0 else round(max(abs(v / mid - 1) for v in values), 4)


def compare_rows(measurement: Mapping[str, Any], profile: Profile,
                 specs: Mapping[str, RunSpec]) -> list[dict[str, Any]]:
    """One row per measured run: per metric predicted, measured (median of the replays),
    relative error, the replays' spread, and the default model (``before``).

    Raises:
        HarnessError: a measured run is not among ``specs`` (wrong scenario paths).
    """
    rows = []
    for run in measurement["runs"]:
        spec = specs.get(run["run_id"])
        if spec is None:
            raise HarnessError(f"run {run['run_id']} of the measurement is not in the "
                               "scenarios given; pass the paths it ran")
        predicted, before = predict(spec, profile), default_model(spec)
        metrics = {}
        for k in METRICS:
            values = [r[k] for r in run["repeats"]]
            measured = round(statistics.median(values))
            metrics[k] = {"predicted": predicted[k], "measured": measured,
                          "rel_err": rel_err(predicted[k], measured),
                          "spread": spread(values), "before": before[k],
                          "before_rel_err": rel_err(before[k], measured)}
        rows.append({"run_id": run["run_id"], "kind": run["kind"], "metrics": metrics})
    return rows


def steady_errors(rows: Sequence[Mapping[str, Any]], limit: float = WORST_TARGET,
                  ) -> dict[str, Any]:
    """Per metric, the |relative error| over the runs whose own replays agree within
    ``limit`` (spread <= limit): how close the model is where the measurement is steady
    enough to hold it to the worst-case target. Shown beside the plain figures, never
    instead of them."""
    out: dict[str, Any] = {"limit": limit}
    for k in METRICS:
        errs = [abs(r["metrics"][k]["rel_err"]) for r in rows
                if r["metrics"][k]["rel_err"] is not None
                and r["metrics"][k]["spread"] is not None and r["metrics"][k]["spread"] <= limit]
        out[k] = {"runs": len(errs),
                  "median_abs_rel_err": round(statistics.median(errs), 4) if errs else None,
                  "max_abs_rel_err": round(max(errs), 4) if errs else None}
    return out


def noise_floor(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per metric, the median and worst spread of the runs' replays."""
    out = {}
    for k in METRICS:
        values = [r["metrics"][k]["spread"] for r in rows if r["metrics"][k]["spread"] is not None]
        out[k] = {"median": round(statistics.median(values), 4) if values else None,
                  "max": round(max(values), 4) if values else None}
    return out


# -- the page ----------------------------------------------------------------------------------

def render_markdown(doc: Mapping[str, Any]) -> str:
    """The page: measurement and profile, the summary line, the noise floor, one row per run."""
    s, noise = doc["summary"], doc["noise_floor"]
    lines = [
        "# Timing replay: predicted against measured", "",
        f"- measurement: `{doc['measurement']}` ({doc['measured_device']}, "
        f"{doc['measured_date']}; {doc['repeats']} replays a run, from prebuilt op lists; "
        f"{doc.get('order', CONSECUTIVE)})",
        f"- profile: `{doc['profile']}` (measured on {doc['profile_device']}, "
        f"{doc['profile_date']}; timing group fitted on {doc['profile_fitted_on']})",
        f"- command: `{doc['command']}`",
        "- prediction: the profile's SYSTEM costs (its timing group) on "
        "`sim.profiled.ProfiledSimDevice`; measured: the median of the replays; both through "
        "`model.metrics.compute_metrics`",
        f"- plot: `{doc['plot']}`", "",
        "## Summary", "", f"**{summary_line(s)}**", "",
        "| metric | runs | median abs err | worst abs err | within 10% | before (default "
        "model) | replay spread median | replay spread worst |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k in METRICS:
        v, n = s[k], noise[k]
        lines.append(f"| {k} | {v['runs']} | {pct(v['median_abs_rel_err'])} "
                     f"| {pct(v['max_abs_rel_err'])} | {v['within_10pct']} "
                     f"| {pct(v['before_median_abs_rel_err'])} | {pct(n['median'])} "
                     f"| {pct(n['max'])} |")
    steady = doc["steady"]
    lines += ["", "Replay spread: per run, max |replay / median of the run's replays - 1|; "
              "the noise floor no prediction can be held closer than.", "",
              f"Over the runs whose replays agree within {steady['limit']:.0%} (spread <= "
              f"{steady['limit']:.0%}; the plain figures above count every run): " + "; ".join(
                  f"{k.removesuffix('_ns')} median {pct(steady[k]['median_abs_rel_err'])} "
                  f"worst {pct(steady[k]['max_abs_rel_err'])} ({steady[k]['runs']} runs)"
                  for k in METRICS) + "."]
    lines += runs_table(doc["rows"], "µs predicted / measured (relative error; replay spread).",
                        lambda m: f"{m['predicted'] / 1000:.1f} / {m['measured'] / 1000:.1f} "
                                  f"({pct(m['rel_err'])}; {pct(m['spread'])})")
    return "\n".join(lines) + "\n"


def compare(measurement_path: str | Path, profile_path: str | Path, paths: Sequence[str],
            out_dir: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """Write ``<measurement>-vs-<profile>.json|md|png``; returns the document and its stem.

    Raises:
        HarnessError: the measurement cannot be read, or a run of it is not in ``paths``.
        ProfileError: the profile is bad.
    """
    profile = load_profile(profile_path)
    mp = Path(measurement_path)
    measurement = read_json_document(mp, "the timing measurement")
    if not isinstance(measurement, dict) or measurement.get("kind") != MEASUREMENT_KIND:
        raise HarnessError(f"{mp}: not a timing measurement (kind {MEASUREMENT_KIND!r})")
    specs = {s.run_id: s for s in suite_specs(paths)}
    rows = compare_rows(measurement, profile, specs)
    out = Path(out_dir) if out_dir else mp.parent
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{mp.stem}-vs-{Path(profile_path).stem}"
    plot = write_plot(rows, stem.with_suffix(".png"),
                      f"{measurement.get('device', '?')} timing replay vs predicted with "
                      f"{Path(profile_path).name}")
    doc = {"kind": CHECK_KIND, "measurement": mp.name,
           "measured_device": measurement.get("device"),
           "measured_date": measurement.get("date"), "repeats": measurement.get("repeats"),
           "order": measurement.get("order", CONSECUTIVE),
           "profile": Path(profile_path).name, "profile_device": profile.device,
           "profile_date": profile.meta["date"],
           "profile_fitted_on": profile.timing.fitted_on if profile.timing else "-",
           "command": f"overlap-harness calibrate --timing-compare {mp.as_posix()} --profile "
                      f"{Path(profile_path).as_posix()} {' '.join(paths)}",
           "plot": plot.name, "summary": summarize(rows), "noise_floor": noise_floor(rows),
           "steady": steady_errors(rows), "rows": rows}
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(render_markdown(doc), encoding="utf-8")
    print(summary_line(doc["summary"]))
    print(f"wrote {stem}.json, .md and .png", file=sys.stderr)
    return doc, stem


def timing_report(paths: Sequence[str], profile_path: str | Path, out: str | Path,
                  repeats: int = 9, log: Callable[[str], None] = print) -> int:
    """On a GPU: replay ``paths`` as op lists (``repeats`` a run), write the measurement
    (``<date>-<device>-timing.json`` and its replays) and its comparison with the profile
    into ``out``; 0 when the targets are met, 1 otherwise (``gpu-check --profile``)."""
    # deferred: needs torch.cuda; the CPU steps of this module import no GPU code
    from overlap_harness.gpu_check.calibration import calibrate
    from overlap_harness.gpu_check.profiling import environment

    rate = calibrate().cycles_per_us
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    meta = {**environment(), "date": now,
            "command": f"overlap-harness gpu-check {' '.join(paths)} --profile {profile_path}"}
    raw: list[tuple[str, list[Replay]]] = []
    doc = measure_suite(paths, rate, repeats, meta, log, raw)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model = re.search(r"\b[A-Z]\d{2,4}\b", meta["device"])  # "NVIDIA H100 80GB HBM3": h100
    device = model.group(0).lower() if model else "gpu"
    path = folder / f"{now[:10]}-{device}-timing.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    with gzip.open(path.with_name(f"{path.stem}-replays.json.gz"), "wt", encoding="utf-8") as fh:
        json.dump(replays_to_data(raw), fh, separators=(",", ":"))
    result, _ = compare(path, profile_path, paths, folder)
    return 0 if result["summary"]["targets_met"] else 1
