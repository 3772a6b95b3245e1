"""``overlap-harness sglang --gpu``: the loop report's rows checked on a CUDA device.

Each (variant, site) the loop report judged is run with the site removed and its race forced
(:mod:`.gpu.table`); the report goes to ``--gpu-report DIR`` (:mod:`.gpu.report`). Exit 0 when
every necessary row showed a wrong value and every redundant row and the unmodified loop stayed
equal to the serial answer, 1 otherwise, 2 without CUDA or on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from overlap_harness.engines.core.command import fail, unknown_variants

PROG = "overlap-harness sglang --gpu"
CHECK_PROG = "overlap-harness sglang --gpu-check-cpu"
DEFAULT_LOOP_REPORT = Path("reports/conformance/sglang-0.5.23-loop.json")
#: ``--gpu-rerun``'s modes (:func:`_resumed`), which the recount's ``--rerun`` names too
RERUN_MODES = ("unsettled", "unrun", "unshown")


def run(args: argparse.Namespace) -> int:
    """Check CUDA, load the tree, run the table, write the report."""
    import torch

    if not torch.cuda.is_available():
        return fail(PROG, "needs a CUDA device; this torch sees none (the CPU mode is "
                    "`overlap-harness sglang` without --gpu)")
    if args.necessity or args.loop_report:
        return fail(PROG, "--gpu reads the necessity verdicts from --loop-json; it does not "
                    "take --necessity or --loop-report")
    loop_path = args.loop_json or DEFAULT_LOOP_REPORT
    if not loop_path.is_file():
        return fail(PROG, f"{loop_path}: no loop report (write one with --necessity "
                    "--loop-report DIR, or pass --loop-json FILE)")
    loop_document = json.loads(loop_path.read_text())
    from overlap_harness.engines.sglang.gpu.loop import KERNELS_VARIABLE

    os.environ[KERNELS_VARIABLE] = args.gpu_kernels  # read by each trial, forked or not
    if args.repro:
        return _repro(args, loop_document)
    names = args.variant or loop_document["variants"]
    if (message := unknown_variants(names, loop_document["variants"])) is not None:
        return fail(PROG, message)
    from overlap_harness.engines.sglang.gpu import report as gpu_report
    from overlap_harness.engines.sglang.gpu import table as gpu_table

    tree = _tree_of(args, loop_document["sglang_version"], "the loop report")
    if isinstance(tree, str):
        return fail(PROG, tree)
    device = torch.cuda.get_device_name()
    print(f"sglang {tree.version} from {tree.package_dir} on {device}; "
          f"{len(names)} variants, {args.jobs} children at a time", flush=True)
    started = time.perf_counter()
    progress = args.gpu_report / "gpu-rows.jsonl" if args.gpu_report else None
    if progress is not None:
        args.gpu_report.mkdir(parents=True, exist_ok=True)
        progress.unlink(missing_ok=True)
    kept, earlier = _resumed(args.gpu_resume, tree.version, args.gpu_rerun,
                             gpu_table.planned_verdicts(loop_document, names))
    if isinstance(kept, str):
        return fail(PROG, kept)
    skip = frozenset((r["variant"], r["site"]) for r in kept)
    from overlap_harness.engines.sglang.gpu import twins

    rows, failures = gpu_table.run_table(loop_document, names, args.jobs, args.gpu_timeout,
                                         args.gpu_deadline, progress, skip,
                                         gpu_table.twin_work(kept, loop_document))
    kept, rows = twins.merged(kept, rows)  # the kept rows' twins, run now
    for row in rows:  # each row names the device and torch its trials ran on
        row["device"], row["torch"] = device, torch.__version__
    if earlier:  # a row run again to go further keeps what its earlier trials showed
        rows = with_earlier_trials(rows, earlier, args.gpu_rerun)
    command = relative_command(sys.argv[1:])
    report = gpu_report.document(
        kept + rows, version=tree.version,
        device=", ".join(sorted({d for r in kept + rows for d in r["device"].split(", ")}))
        or device,
        torch_version=", ".join(sorted({v for r in kept + rows for v in r["torch"].split(", ")}))
        or torch.__version__,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=(f"{without_local_paths(earlier['command'])}; then {command}" if earlier
                 else command),
        failures=[f for f in (earlier or {}).get("child_failures", [])
                  if not re.search(r": stopped (at the deadline|\(.*\))$", f)] + failures,
        seconds=time.perf_counter() - started + (earlier or {}).get("seconds", 0.0))
    if earlier:
        before = [{**run, "command": without_local_paths(run["command"])} for run in
                  earlier.get("runs") or [{"date": earlier["date"],
                                           "command": earlier["command"],
                                           "seconds": earlier["seconds"]}]]
        now = {"date": report["date"], "command": command,
               "seconds": round(time.perf_counter() - started, 1)}
        report["runs"] = [*before, now]
    print(json.dumps(report["summary"]))
    if args.gpu_report:
        for path in gpu_report.write(report, args.gpu_report):
            print(f"wrote {path}")
    s = report["summary"]
    clean = not (s["race_rows_all_equal"] or s["race_free_rows_wrong"] or s["unmodified_wrong"]
                 or s["errors"])
    return 0 if clean else 1


def _tree_of(args: argparse.Namespace, version: str, what: str) -> object | str:
    """SGLang's tree loaded (``--sglang-src`` or the installed one) and named to the child
    processes; an error text when it cannot load or is not ``version`` (``what``'s)."""
    from overlap_harness.engines.sglang import environment

    try:
        tree = environment.load(args.sglang_src)
    except environment.SglangTreeError as exc:
        return str(exc)
    if tree.version != version:
        return f"sglang {tree.version} imported, {what} is of {version}"
    if args.sglang_src:
        os.environ["OVERLAP_HARNESS_SGLANG_SRC"] = str(args.sglang_src)
    return tree


def check_cpu(args: argparse.Namespace) -> int:
    """``--gpu-check-cpu FILE``: each timing row of the GPU report checked against the CPU
    mode (:mod:`.gpu.cpu_check`), the report rewritten. Exit 1 when a row's ordering is one
    the CPU mode does not record (the CPU mode to be fixed there), else 0."""
    from overlap_harness.engines.sglang.gpu import cpu_check
    from overlap_harness.engines.sglang.gpu import report as gpu_report

    if args.gpu:
        return fail(CHECK_PROG, "runs the CPU mode; it does not take --gpu")
    if not args.gpu_check_cpu.is_file():
        return fail(CHECK_PROG, f"{args.gpu_check_cpu}: no GPU report")
    report = json.loads(args.gpu_check_cpu.read_text())
    tree = _tree_of(args, report["sglang_version"], "the GPU report")
    if isinstance(tree, str):
        return fail(CHECK_PROG, tree)
    print(f"{len(cpu_check.timing_rows(report))} timing rows of {args.gpu_check_cpu}: each "
          f"variant run in CPU mode without the row's site ({args.jobs} at a time)", flush=True)
    checked = cpu_check.check_report(report, args.jobs)
    report["summary"] = gpu_report.summary(report["rows"])
    for path in gpu_report.write(report, args.gpu_check_cpu.parent):
        print(f"wrote {path}")
    misses = [r for r in cpu_check.timing_rows(report)
              if r["cpu_verdict_checked"].get("cpu_misses")]
    for row in misses:
        print(f"{row['variant']} {row['site']}: {row['cpu_verdict_checked']['finding']}")
    print(f"{checked} rows checked; {len(misses)} with an ordering the CPU mode does not "
          "record")
    return 1 if misses else 0


def relative_command(argv: list[str]) -> str:
    """The command as run, every path argument relative to the working directory (the
    repository) or, outside it, by its name alone: no machine's local path in a report."""
    words = []
    for word in argv:
        if word.startswith("/") and Path(word).exists():
            path = Path(word)
            try:
                word = str(path.resolve().relative_to(Path.cwd().resolve()))
            except ValueError:
                word = f"<{path.name}>"
        words.append(word)
    return "overlap-harness " + shlex.join(words)


_ABSOLUTE_PATH = re.compile(r"(?<![\w.<])/(?:[\w.+-]+/)*([\w.+-]+)")


def without_local_paths(command: str) -> str:
    """An earlier run's command with each absolute path (a machine's output folder, staged
    resume file) named by its last part, ``<prev.json>``, as :func:`relative_command` names
    paths outside the repository: a resumed report's chain of commands carries no machine's
    local path even where an older run wrote one."""
    return _ABSOLUTE_PATH.sub(lambda match: f"<{match.group(1)}>", command)


def parse_forcing(label: str) -> tuple[str, bool, int]:
    """``'forward_stream@earlier+8388608cy'`` -> (``'forward_stream'``, targeted, cycles)."""
    from overlap_harness.engines.sglang.gpu.loop import parse_label

    parsed = parse_label(label)
    if parsed is None:
        raise ValueError(f"--repro-forcing {label!r}: expected STREAM[@earlier]+Ncy, as a "
                         "GPU report's forced_delay labels it")
    return parsed


def _repro(args: argparse.Namespace, loop_document: dict) -> int:
    """``--repro VARIANT SITE``: the serial answer, then SITE removed and one forcing; the
    first wrong value, and how to make it by hand (a maintainer's patch: the site's line
    removed, ``torch.cuda._sleep`` before the earlier side's ops). Exit 1 when the value is
    wrong (the race shown), 0 when not."""
    from overlap_harness.engines.core.mutation import Coverage, remove_site
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.gpu import table as gpu_table
    from overlap_harness.engines.sglang.gpu.loop import Forcing, run_trial
    from overlap_harness.engines.sglang.gpu.probe import probes

    variant, site = args.repro
    site = None if site == "-" else site
    if variant not in loop_document["variants"]:
        return fail(PROG, f"--repro {variant}: not a variant of the loop report")
    rows = [r for r in loop_document["rows"] if r["variant"] == variant and r["site"] == site]
    if site is not None and not rows:
        return fail(PROG, f"--repro {variant} {site}: no such row in the loop report")
    examples = rows[0]["race_examples"] if rows else []
    try:
        stream, targeted, cycles = parse_forcing(args.repro_forcing or "")
    except ValueError as exc:
        return fail(PROG, str(exc))
    try:
        environment.load(args.sglang_src)
    except environment.SglangTreeError as exc:
        return fail(PROG, str(exc))
    serial_trial, serial, _ = run_trial(variant, Forcing(serial=True), None)
    if serial is None:
        return fail(PROG, f"the serial run of {variant} failed: {serial_trial.error}")
    if site is not None:
        remove_site(gpu_table.find_site(site), Coverage())
    held = ", ".join(probes(examples, stream).earlier) or "every op of the stream"
    print(f"{variant} without {site or 'no site (the unmodified loop)'}; "
          f"torch.cuda._sleep({cycles}) on {stream} before "
          f"{'the earlier side: ' + held if targeted else 'each of its ops'}")
    for attempt in range(1, args.repro_trials + 1):  # a made race need not corrupt each time
        trial = run_trial(variant, Forcing((stream,), cycles, targeted=targeted), serial,
                          probes(examples, stream))[0]
        print(f"trial {attempt}: held {trial.sleeps} ops; race made: {trial.race_made} "
              f"(probe {trial.probe})")
        if trial.error:
            print(f"crashed: {trial.error}")
        elif trial.wrong:
            print(f"wrong: {trial.wrong}")
        else:
            print("every value equals the serial answer")
        if trial.wrong or trial.error:
            break
    if site is not None and targeted:
        print(f"by hand: delete {site}; before {held} (on {stream}) insert "
              f"`torch.cuda._sleep({cycles})`; run the variant and compare with the serial "
              "run")
    return 1 if trial.wrong or trial.error else 0


def _last_per_stream(trials: list[dict]) -> dict[str, dict]:
    """Each delayed stream's last trial record, by the stream its forcing names."""
    from overlap_harness.engines.sglang.gpu.loop import parse_label

    last: dict[str, dict] = {}
    for trial in trials:
        parsed = parse_label(trial["forcing"])
        if parsed is not None:
            last[parsed[0]] = trial
    return last


def stopped_short(row: dict) -> bool:
    """An unmodified loop's row, or a race row without a wrong value or a made crash, whose
    child a deadline or a signal stopped after some of its trials (``aborted: not run:
    ...``): its forcings are incomplete (an unmodified loop that held one stream of five is
    no control of the others), so a resumed run runs it again in any mode, a race row's
    earlier trials kept (:func:`with_earlier_trials`). A row whose child died keeps its
    trials: it would die again."""
    from overlap_harness.engines.sglang.gpu.twins import wrong_or_made_crash

    if not str(row.get("aborted") or "").startswith("not run"):
        return False
    if row["cpu_verdict"] is None:
        return True
    return row["cpu_verdict"] == "race" and not any(
        wrong_or_made_crash(t) for t in row.get("trial_details", []))


def grows_further(row: dict) -> bool:
    """A race row without a wrong value or a made crash whose delay, on some stream, stopped
    at the fixed steps though its last trial there made the race, where the current rule
    gives that trial one more, longer one (:func:`.gpu.table.further_cycles`; since
    2026-12-07's fifth session): a resumed run
    runs it again, its earlier trials kept (:func:`with_earlier_trials`)."""
    from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
    from overlap_harness.engines.sglang.gpu.loop import Trial, parse_label
    from overlap_harness.engines.sglang.gpu.table import further_cycles
    from overlap_harness.engines.sglang.gpu.twins import made, wrong_or_made_crash

    trials = row.get("trial_details", [])
    if row["cpu_verdict"] != "race" or any(wrong_or_made_crash(t) for t in trials):
        return False
    for stream, trial in _last_per_stream(trials).items():
        cycles = parse_label(trial["forcing"])[2]
        if made(trial) and cycles <= RACE_CYCLES[-1] and further_cycles(
                Trial(**trial), cycles, stream) is not None:
            return True
    return False


def unshown_before_dirtying(row: dict) -> bool:
    """A race row none of whose trials showed a wrong value or crashed having made the race,
    and none of them from dirtied caches (``Trial.dirtied``): a made race may have read an
    earlier run's right answer left in a reused block. ``--gpu-rerun unshown`` runs it
    again, each trial from dirtied caches, its earlier trials kept beside the new ones
    (:func:`with_earlier_trials`)."""
    from overlap_harness.engines.sglang.gpu.twins import wrong_or_made_crash

    trials = row.get("trial_details", [])
    return (row["cpu_verdict"] == "race" and bool(trials)
            and not any(wrong_or_made_crash(t) for t in trials)
            and not any(t.get("dirtied") for t in trials))


def with_earlier_trials(rows: list[dict], earlier: dict, rerun: str = "unshown"
                        ) -> list[dict]:
    """``rows`` where each row that ran again to go further than its earlier trials could
    (:func:`grows_further`, :func:`stopped_short`; with ``rerun="unshown"``,
    :func:`unshown_before_dirtying` too), if a race row,
    also holds the earlier report's trials and twin trials of that row, first, its counts
    recomputed from all of them: each trial is its own experiment, and a value the earlier
    ones showed at an access stays shown. The row names both runs' devices and torch
    versions. Any row that ran no trial now (the deadline came first) is the earlier
    report's row where that one ran trials for the same plan (:func:`same_plan`)."""
    from overlap_harness.engines.sglang.gpu.table import recounted

    before = {(r["variant"], r["site"]): r for r in earlier["rows"]
              if r["cpu_verdict"] == "race" and (
                  grows_further(r) or stopped_short(r)
                  or (rerun == "unshown" and unshown_before_dirtying(r)))}
    ran = ran_rows(earlier)
    out = []
    for row in rows:
        if row.get("twin_only"):
            out.append(row)
            continue
        kept = earlier_in_place(row, ran, earlier)
        if kept is not None:
            # the deadline came before it ran: what its earlier trials showed stays (an
            # unmodified loop's control too, not an error)
            out.append(kept)
            continue
        old = before.get((row["variant"], row["site"]))
        if old is None or not row.get("trials"):
            out.append(row)
            continue
        both = {**row, "trial_details": [*old["trial_details"], *row["trial_details"]],
                "twin_trials": [*old.get("twin_trials", []), *row.get("twin_trials", [])],
                "trials": old["trials"] + row["trials"]}
        for key in ("device", "torch"):
            names = [*old.get(key, earlier[key]).split(", "), *row[key].split(", ")]
            both[key] = ", ".join(dict.fromkeys(names))
        out.append(recounted(both))
    return out


def ran_rows(earlier: dict) -> dict[tuple[str, str | None], dict]:
    """An earlier report's rows that ran trials, by (variant, site): what
    :func:`earlier_in_place` takes from."""
    return {(r["variant"], r["site"]): r for r in earlier["rows"] if r.get("trials")}


def earlier_in_place(row: dict, ran: dict[tuple[str, str | None], dict], earlier: dict
                     ) -> dict | None:
    """The earlier report's row (naming its device and torch) to stand for ``row`` where
    ``row`` ran no trial and that one (of ``ran``, :func:`ran_rows`) ran trials for the same
    plan (:func:`same_plan`); else None. A resumed run and the recount's ``--earlier``
    both keep rows so."""
    old = ran.get((row["variant"], row["site"]))
    if row.get("trials") or old is None or not same_plan(old, row):
        return None
    return {"device": earlier["device"], "torch": earlier["torch"], **old}


def same_plan(old: dict, row: dict) -> bool:
    """Whether two runs of a row were forced for the same plan: the same CPU verdict and
    released races (a row whose plan changed ran for another verdict; asked by
    :func:`earlier_in_place`)."""
    from overlap_harness.engines.sglang.gpu.table import plan_of

    return plan_of(old) == plan_of(row)


def stopped_at_unmade_crash(row: dict) -> bool:
    """A race row that never made its race and whose delays stopped growing at a crash the
    probe did not see make it, short of the longest fixed delay (the rule before
    2026-12-07's fourth session; a child that died there would die again): run again, its
    delays now grow past such a crash (:func:`.gpu.table._race_trials`)."""
    from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
    from overlap_harness.engines.sglang.gpu.loop import parse_label
    from overlap_harness.engines.sglang.gpu.twins import made

    if row["cpu_verdict"] != "race" or row.get("race_made_trials"):
        return False
    last = _last_per_stream(row.get("trial_details", []))
    return any(t.get("error") and "child failed" not in t["error"]
               and not made(t)
               and parse_label(t["forcing"])[2] < RACE_CYCLES[-1] for t in last.values())


def _resumed(path: Path | None, version: str, rerun: str = "unsettled",
             planned: dict | None = None) -> tuple[list[dict] | str, dict | None]:
    """The settled rows of an earlier report (``--gpu-resume``; counts recomputed from their
    trials, :func:`.gpu_table.settled`; each row keeps the device and torch it ran on) and
    that report; an error text when it is of another tree. Its other rows run again. With
    ``rerun="unrun"`` every row whose trials ran is kept (only errors and rows the deadline
    left run again); ``rerun="unshown"`` runs :func:`unshown_before_dirtying` rows again as
    well (:func:`with_earlier_trials` keeps their earlier trials). With
    ``planned`` (:func:`.gpu_table.planned_verdicts`), a row whose CPU
    verdict or released races differ from this loop report's plan runs again (its trials
    were forced for another verdict: an unmodified loop that now races as released). An
    unmodified loop's row whose trials predate the acceptance record runs again, and so
    does a race row that stopped at a crash which did not make its race
    (:func:`stopped_at_unmade_crash`), and a control with a crashed trial
    (:func:`.gpu_report.crashed_control`). Rows of a variant ``planned`` does not hold (a run
    of some variants, ``--variant``) are all kept as they were: none of them runs now."""
    from overlap_harness.engines.sglang.gpu import report as gpu_report
    from overlap_harness.engines.sglang.gpu.table import plan_of, recounted, settled

    if path is None:
        return [], None
    earlier = json.loads(path.read_text())
    if earlier["sglang_version"] != version:
        return (f"{path}: a report of sglang {earlier['sglang_version']}, not "
                f"{version}"), None
    # an unmodified loop's row from before the acceptance record (gpu.loop.observe) was
    # compared holds no control of it: it runs again
    compared = {(r["variant"], r["site"]) for r in earlier["rows"]
                if r.get("trial_details") and all("acceptance_wrong" in t
                                                  for t in r["trial_details"])}
    rows = [{"device": earlier["device"], "torch": earlier["torch"], **recounted(r)}
            for r in earlier["rows"]]

    running = {variant for variant, _ in planned} if planned is not None else None

    def keep(row: dict) -> bool:
        key = (row["variant"], row["site"])
        if running is not None and row["variant"] not in running:
            return True  # a variant this run does not name (--variant): its rows as they were
        if row["site"] is None and key not in compared:
            return False
        if stopped_at_unmade_crash(row) or grows_further(row) or stopped_short(row) \
                or gpu_report.crashed_control(row):
            return False
        if planned is not None and key in planned and planned[key] != plan_of(row):
            return False
        if rerun == "unshown" and unshown_before_dirtying(row):
            return False
        if rerun in ("unrun", "unshown"):
            return bool(row.get("trials")) and not row.get("error")
        return settled(row)

    return [r for r in rows if keep(r)], earlier
