"""``overlap-harness calibrate``: measure a device profile on a GPU, or hold one to a GPU report.

Two uses of one subcommand:

- ``calibrate --out profiles/NAME.json`` (needs CUDA) measures the profile
  (:mod:`model.profile`): the system's costs on raw torch.cuda (:mod:`gpu_check.profiling`)
  and the harness replay's own costs, from the protocol replayed on ``CudaDevice`` over the
  calibration scenarios (``profiles/calibration/``, none of them in the bundled suite) beside
  the simulator (:func:`measure_harness`).
- ``calibrate --compare REPORT.json --profile FILE [SCENARIOS...]`` (CPU) predicts every run
  of a ``gpu-check`` report with the profile's replay costs and writes the
  predicted-vs-measured page, its JSON and the plot (:mod:`overlap_harness.profile_check`).

:func:`add_profile_argument` and :func:`apply_profile` are the ``--profile FILE`` option
for ``run``, ``whatif``, ``report`` and ``gpu-check``: the CLI adds the option with the first
and maps each loaded scenario through the second.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gzip
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from overlap_harness.cli_options import count
from overlap_harness.model.config import Scenario
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.op_list import replays_from_data, replays_to_data
from overlap_harness.model.profile import (
    Mode,
    Profile,
    ProfileCosts,
    costs_from_profile,
    dump_profile,
    load_profile,
)
from overlap_harness.model.trace import OpRecord
from overlap_harness.output_paths import prepare_outputs

DEFAULT_CALIBRATION = "profiles/calibration"


class NoCudaError(HarnessError):
    """``calibrate`` was asked to measure on a machine without a CUDA device."""


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--profile FILE`` to a subcommand's parser (``args.profile``: a path or None)."""
    parser.add_argument("--profile", metavar="FILE", default=None,
                        help="a device profile (profiles/*.json, written by `calibrate`): "
                             "the simulator takes its measured host launch and copy costs "
                             "(docs/calibration.md); a scenario's own profile key otherwise")


def apply_profile(scenario: Scenario, profile: Profile | str | Path | None,
                  mode: Mode = Mode.SYSTEM) -> Scenario:
    """``scenario`` with the profile's Timing (:func:`model.profile.costs_from_profile`);
    unchanged without a profile. A path is loaded first. Without ``profile``, the one the
    scenario names (its ``profile`` key, relative to the scenario file's folder) is used.

    Raises:
        ProfileError: the profile file is bad (one line).
    """
    if profile is None and scenario.profile:
        profile = Path(scenario.path).parent / scenario.profile
    if profile is None:
        return scenario
    if not isinstance(profile, Profile):
        profile = load_profile(profile)
    costs = costs_from_profile(profile, scenario.timing, mode)
    return dataclasses.replace(scenario, timing=costs.timing)


def profile_costs(scenario: Scenario, profile: Profile, mode: Mode) -> ProfileCosts:
    """The per-call-kind costs ``sim.profiled.ProfiledSimDevice`` takes for ``scenario``."""
    return costs_from_profile(profile, scenario.timing, mode)


# -- measuring (GPU) ----------------------------------------------------------------------

Pairs = list[tuple[list[OpRecord], list[OpRecord]]]


def measure_harness(scenario_paths: Sequence[str], cal: Any,
                    runs: int = 3) -> tuple[Pairs, list[str]]:
    """Replay every run of the calibration scenarios ``runs`` times on the device class
    ``gpu-check`` replays on (``SentinelCudaDevice``: CudaDevice plus the simulator's
    never-written memory), after one unmeasured warm-up that loads the kernels' modules,
    beside its simulation; the (measured, simulated) timelines, which
    :func:`gpu_check.profiling.harness_from_timelines` reads the harness's costs off, and
    the run id of each pair."""
    # deferred: imports torch; the command line registers this parser without it
    from overlap_harness.model.protocol import (
        run_protocol,  # deferred: torch; the CLI registers this parser
    )
    from overlap_harness.replay.sentinel import SentinelCudaDevice  # deferred: needs torch.cuda
    from overlap_harness.runner import simulate
    from overlap_harness.scenarios.expand import expand
    from overlap_harness.scenarios.loader import load_paths

    pairs: Pairs = []
    run_ids: list[str] = []
    for sc in load_paths(scenario_paths):
        for spec in expand(sc):
            scenario = dataclasses.replace(spec.scenario, protocol=spec.protocol)
            _, sim_dev = simulate(scenario, spec.removed, jitter=0.0)
            sim_timeline = sim_dev.finish().timeline
            for attempt in range(runs + 1):
                dev = SentinelCudaDevice(spec.removed, calibration=cal)
                run_protocol(dev, scenario)
                measured = dev.finish().timeline
                if attempt:
                    pairs.append((measured, sim_timeline))
                    run_ids.append(spec.run_id)
    return pairs, run_ids


def with_harness(profile: Profile, pairs: Pairs, note: str) -> Profile:
    """``profile`` with its harness group fitted on ``pairs`` (pure apart from the fit)."""
    # deferred: imports torch; the command line registers this parser without it
    from overlap_harness.gpu_check.profiling import (
        harness_from_timelines,  # deferred: imports torch
    )

    h_issue, h_extra, by_op, extra_by_op = harness_from_timelines(pairs)
    return dataclasses.replace(profile, harness_issue_us=h_issue, harness_extra_us=h_extra,
                               harness_issue_by_op_us=by_op,
                               harness_extra_by_op_us=extra_by_op,
                               notes=(*profile.notes, note))


def write_timelines(pairs: Pairs, path: Path, run_ids: Sequence[str] = ()) -> None:
    """The calibration timelines as gzipped JSON (``calibrate --refit`` reads them)."""
    # deferred: imports torch; the command line registers this parser without it
    from overlap_harness.gpu_check.profiling import timelines_to_data

    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(timelines_to_data(pairs, run_ids), fh)


def read_timelines(path: Path) -> Pairs:
    """:func:`write_timelines` read back.

    Raises:
        HarnessError: the file cannot be read or is not such a file (one line).
    """
    # deferred: imports torch; the command line registers this parser without it
    from overlap_harness.gpu_check.profiling import timelines_from_data

    return _read_gzip_json(path, timelines_from_data, "a calibration timelines file")


def _read_gzip_json(path: Path, parse: Callable[[Any], Any], what: str) -> Any:
    """``parse`` of a gzipped JSON file; an unreadable or malformed one is a one-line
    :class:`HarnessError` naming ``what`` it should have been."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return parse(json.load(fh))
    except (OSError, EOFError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise HarnessError(f"{path}: not {what}: {exc}") from None


def measure_profile(calibration_paths: Sequence[str], runs: int, command: str,
                    log: Any = print, suite: Sequence[str] = (), rounds: int = 0,
                    ) -> tuple[Profile, Pairs, list[str], list, list]:
    """Every figure of a profile, on the current CUDA device (see the module docstring).

    Returns the profile, the calibration timelines it was fitted on, their run ids, the
    calibration workloads' timing replays (``model.op_list.replays_to_data``), and the timing
    replays of the runs at ``suite``: replayed in the same ``rounds`` interleaved rounds as
    the calibration workloads (``runs`` rounds when no suite is given).

    Raises:
        NoCudaError: no CUDA device.
    """
    import torch  # deferred: only the measuring path needs torch.cuda

    if not torch.cuda.is_available():
        raise NoCudaError("calibrate needs a CUDA device to measure; "
                          "torch.cuda.is_available() is False")
    # deferred: imports torch; the command line registers this parser without it
    from overlap_harness.gpu_check import profiling
    from overlap_harness.gpu_check.calibration import calibrate

    t0, c0 = time.perf_counter(), time.process_time()
    cal = calibrate()
    log(f"_sleep: {cal.cycles_per_us:.1f} cycles/us")
    issue = profiling.measure_issue()
    log("system issue us: " + profiling.by_kind(issue))
    gap = profiling.measure_sync_to_launch()
    log(f"sync -> next launch: {gap.median:.1f} us")
    durations = profiling.measure_durations()
    notes = []
    try:
        launch = profiling.profiler_launch_us()
    except Exception as exc:  # the profiler is a cross-check: its failure is a note
        launch = None
        notes.append(f"torch.profiler cross-check failed: {type(exc).__name__}: {exc}")
    if launch is not None:
        notes.append(f"torch.profiler: cudaLaunchKernel CPU time median {launch:.1f} us "
                     f"(the driver's share of kernel_launch {issue['kernel_launch'].median:.1f}"
                     " us)")
    from overlap_harness.timing_check import fit_timing_group  # deferred: imports the sim

    timing, timing_runs, suite_replays = fit_timing_group(
        calibration_paths, cal.cycles_per_us, rounds if suite else runs, suite, log)
    log("timing call us: " + profiling.by_kind(timing.call_us))
    log("timing figures us: " + profiling.by_kind(timing.figures | timing.copy_us))
    pairs, run_ids = measure_harness(calibration_paths, cal, runs)
    notes.append(f"measured in {time.perf_counter() - t0:.0f} s wall, "
                 f"{time.process_time() - c0:.0f} s CPU")
    meta = {**profiling.environment(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": command}
    bare = Profile(meta, cal.cycles_per_us, issue, gap, durations, {}, {}, notes=tuple(notes),
                   timing=timing)
    profile = with_harness(bare, pairs, f"harness fitted on {', '.join(calibration_paths)} "
                                        f"({runs} replays a run)")
    log("harness issue us: " + profiling.by_kind(profile.harness_issue_us))
    log("harness extra GPU us: " + profiling.by_kind(profile.harness_extra_us))
    return profile, pairs, run_ids, timing_runs, suite_replays


# -- the subcommand -----------------------------------------------------------------------

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``calibrate`` on the CLI's subparsers; returns its parser."""
    c = subparsers.add_parser(
        "calibrate", help="measure a device profile on a GPU, or compare one with a GPU report",
        description="With --out: measure the host issue cost per op kind, kernel and copy "
                    "durations by size, the sync-to-launch gap and the harness replay's own "
                    "costs on this GPU and write a profile. With --compare: predict every run "
                    "of a gpu-check report with a profile and write predicted vs measured "
                    "(CPU). Exit 0: done (compare: targets met), 1: compare targets missed, "
                    "2: bad input or no GPU.")
    c.add_argument("paths", nargs="*", default=["scenarios"],
                   help="with --compare: the scenario files or folders the report ran "
                        "(default scenarios)")
    c.add_argument("--out", metavar="FILE", help="profile to write (profiles/NAME.json)")
    c.add_argument("--calibration", nargs="+", default=[DEFAULT_CALIBRATION], metavar="PATH",
                   help=f"scenarios the harness costs are fitted on (default "
                        f"{DEFAULT_CALIBRATION}; keep them out of the suite you judge)")
    c.add_argument("--runs", type=count(1), default=3, metavar="N",
                   help="measured replays of each calibration run (default 3)")
    c.add_argument("--compare", metavar="REPORT", help="a gpu-check report (.json) to predict")
    c.add_argument("--timelines", metavar="FILE", default=None,
                   help="with --out: also write the calibration timelines (.json.gz)")
    c.add_argument("--refit", metavar="TIMELINES", default=None,
                   help="with --profile and --out: fit the harness group again on saved "
                        "calibration timelines (CPU); the system group is kept")
    c.add_argument("--timing-suite", nargs="+", default=None, metavar="PATH",
                   help="with --out: after measuring, replay these scenarios (the bundled "
                        "suite: scenarios) as prebuilt op lists and write the timing "
                        "measurement and its comparison with the new profile to --report-out")
    c.add_argument("--repeats", type=count(2), default=5, metavar="N",
                   help="timing replays of each suite run, one per interleaved round; the "
                        "calibration workloads are replayed in the same rounds (default 5)")
    c.add_argument("--refit-timing", metavar="REPLAYS", default=None,
                   help="with --profile and --out: fit the timing group again on saved timing "
                        "replays of the calibration workloads (<profile>-timing-calibration"
                        ".json.gz; CPU); the rest of the profile is kept")
    c.add_argument("--timing-compare", metavar="MEASUREMENT", default=None,
                   help="a timing measurement (.json, from --timing-suite) to predict with "
                        "--profile (CPU)")
    add_profile_argument(c)
    c.add_argument("--report-out", metavar="DIR", default=None,
                   help="folder for the comparison page, JSON and plot (default: the "
                        "report's folder)")
    c.set_defaults(func=run_calibrate)
    return c


def run_calibrate(args: argparse.Namespace) -> int:
    """The ``calibrate`` command; returns the exit status.

    Raises:
        HarnessError: bad usage (one line): neither or both of --out and --compare; an
            output path that cannot be written (before any work).
    """
    if args.refit_timing:
        return refit_timing(args)
    if args.timing_compare:
        if not args.profile:
            raise HarnessError("calibrate --timing-compare needs --profile FILE")
        _prepare_outputs(args, Path(args.report_out or Path(args.timing_compare).parent))
        from overlap_harness.timing_check import compare  # deferred: plots

        doc, _ = compare(args.timing_compare, args.profile, args.paths, args.report_out)
        return 0 if doc["summary"]["targets_met"] else 1
    if bool(args.out) == bool(args.compare):
        raise HarnessError("calibrate: give --out FILE (measure, on a GPU) or --compare "
                           "REPORT.json --profile FILE (CPU), not both or neither (or "
                           "--timing-compare MEASUREMENT.json --profile FILE)")
    if args.refit:
        if not args.profile:
            raise HarnessError("calibrate --refit needs --profile FILE (the system group)")
        _prepare_outputs(args)
        base = load_profile(args.profile)
        profile = with_harness(base, read_timelines(Path(args.refit)),
                               f"harness refitted on {Path(args.refit).name}")
        dump_profile(profile, args.out)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    if args.compare:
        from overlap_harness.profile_check import compare_command  # deferred: plots

        if not args.profile:
            raise HarnessError("calibrate --compare needs --profile FILE")
        _prepare_outputs(args, Path(args.report_out or Path(args.compare).parent))
        return compare_command(args.compare, args.profile, args.paths, args.report_out)
    out = Path(args.out)
    _prepare_outputs(args, Path(args.report_out or ".") if args.timing_suite else None)
    given = getattr(args, "argv", None) or sys.argv[2:]  # main() sets argv; the CLI has sys.argv
    command = " ".join(["overlap-harness", "calibrate", *given])
    t0, c0 = time.perf_counter(), time.process_time()
    profile, pairs, run_ids, timing_runs, suite_replays = measure_profile(
        args.calibration, args.runs, command, log=lambda s: print(s, flush=True),
        suite=args.timing_suite or (), rounds=args.repeats)
    dump_profile(profile, out)
    write_replays(timing_runs, out.with_name(f"{out.stem}-timing-calibration.json.gz"))
    if args.timelines:
        write_timelines(pairs, Path(args.timelines), run_ids)
    load_profile(out)  # what was written reads back
    print(f"wrote {out}", file=sys.stderr)
    if args.timing_suite:
        return timing_suite(args, profile, out, suite_replays, (t0, c0))
    return 0


def _prepare_outputs(args: argparse.Namespace, report_folder: Path | None = None) -> None:
    """Every path this calibrate run writes, prepared before it measures or reads anything
    (:func:`overlap_harness.output_paths.prepare_outputs`): the profile (--out), the
    timelines, and the folder of the comparison (``report_folder``: --report-out, or the
    folder it defaults to)."""
    flag = "--report-out" if args.report_out else "--report-out (default)"
    prepare_outputs(files={"--out": args.out, "--timelines": args.timelines},
                    folders={flag: report_folder})


def write_replays(runs: list, path: Path) -> None:
    """Timing replays by run id as gzipped JSON (``--refit-timing`` reads them)."""
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(replays_to_data(runs), fh, separators=(",", ":"))


def read_replays(path: Path) -> list:
    """:func:`write_replays` read back.

    Raises:
        HarnessError: the file cannot be read or is not such a file (one line).
    """
    return _read_gzip_json(path, replays_from_data, "a timing replays file")


def refit_timing(args: argparse.Namespace) -> int:
    """``--refit-timing``: the profile's timing group fitted again on saved replays (CPU)."""
    from overlap_harness.timing_check import group_from_runs  # deferred: imports the sim

    if not (args.profile and args.out):
        raise HarnessError("calibrate --refit-timing needs --profile FILE and --out FILE")
    _prepare_outputs(args)
    base = load_profile(args.profile)
    path = Path(args.refit_timing)
    group = group_from_runs(read_replays(path), f"timing replays in {path.name}")
    dump_profile(dataclasses.replace(base, timing=group), args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def timing_suite(args: argparse.Namespace, profile: Profile, profile_path: Path,
                 measured: list, started: tuple[float, float]) -> int:
    """``--timing-suite``: the suite's timing replays (``measured``: replayed in the same
    interleaved rounds as the calibration workloads, :func:`measure_profile`) as the
    measurement (``<date>-<device>-timing.json``) and its comparison with the new profile;
    ``started``: wall and CPU clocks when the measuring began (the elapsed figures)."""
    # deferred: imports the sim
    from overlap_harness.timing_check import compare, measure_suite

    t0, c0 = started
    meta = {**{k: profile.meta[k] for k in ("device", "driver", "torch", "cuda", "python")},
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "command": " ".join(["overlap-harness", "calibrate",
                                 *(getattr(args, "argv", None) or sys.argv[2:])])}
    raw: list = []
    doc = measure_suite(args.timing_suite, profile.sleep_cycles_per_us, args.repeats, meta,
                        log=lambda s: print(s, flush=True), raw=raw, measured=measured)
    doc["elapsed"] = {"wall_s": round(time.perf_counter() - t0, 1),
                      "cpu_s": round(time.process_time() - c0, 1)}
    out = Path(args.report_out or ".")
    out.mkdir(parents=True, exist_ok=True)
    name = profile_path.stem
    path = out / f"{doc['date'][:10]}-{name}-timing.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    write_replays(raw, path.with_name(f"{path.stem}-replays.json.gz"))
    print(f"wrote {path} ({doc['elapsed']['wall_s']} s wall)", file=sys.stderr)
    result, _ = compare(path, profile_path, args.timing_suite, out)
    return 0 if result["summary"]["targets_met"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m overlap_harness.calibrate_cmd``: the subcommand on its own, until the CLI
    registers it. Errors are one line on stderr, exit 2."""
    parser = argparse.ArgumentParser(prog="overlap-harness")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["calibrate", *argv])
    args.argv = argv
    try:
        return args.func(args)
    except HarnessError as exc:
        print(f"overlap-harness: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
