"""The necessity table checked on a GPU: each sync site removed, its race forced, values compared.

Rows come from the loop report (``reports/conformance/sglang-VERSION-loop.json``): every
(variant, site) whose CPU verdict is ``race`` or ``race_free``. For a ``race`` row the stream of
the earlier side of each race the CPU mode reported is delayed (:mod:`.gpu_loop`), one trial
per (stream, delay); a ``race_free`` row and the unmodified loop (a row without a site, per
variant) delay each stream the loop holds in turn. Each trial's values are compared with the
serial answer of the unmodified loop.

Each site runs in its own child process (the removal is never undone; CUDA does not survive a
fork), ``jobs`` at a time: ``python -m overlap_harness.engines.sglang.gpu.table SPEC OUT``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from overlap_harness.engines.sglang.gpu.delays import (
    CONTROL_CYCLES,
    FASTEST_CLOCK_HZ,
    LONGEST_HELD_S,
    LONGEST_RACE_CYCLES,
    RACE_CYCLES,
    SLOWEST_CLOCK_HZ,
    SWEEP_CYCLES,
)

_AGENT = re.compile(r" on (.+?) at ")


def earlier_streams(race_examples: Sequence[str]) -> list[str]:
    """The streams (attribute names) of the earlier side of each CPU race, in first-seen
    order: ``'WAR x: op on self.forward_stream at f:1 / op on host at g:2'`` ->
    ``['forward_stream']``; ``host`` where the earlier side is a host action (a host write of
    pinned memory, an allocator free): the host is then held at that line."""
    out: list[str] = []
    for example in race_examples:
        agents = _AGENT.findall(example)
        if not agents:
            continue
        name = agents[0].removeprefix("self.")
        if name not in out:
            out.append(name)
    return out


def plan(loop_document: dict[str, Any], variants: Sequence[str] | None = None,
         skip: frozenset[tuple[str, str | None]] = frozenset(),
         twin_rows: Sequence[dict[str, Any]] = ()
         ) -> dict[str | None, list[dict[str, Any]]]:
    """Site -> its rows to run (None -> the unmodified loop's rows, one per variant: a race
    row where the loop report lists the variant's ``released_races``; and ``twin_rows``,
    an earlier report's rows that need twin trials, which remove nothing:
    :func:`.gpu.twins.twin_work`), less the (variant, site) pairs in ``skip`` (rows an
    earlier run already has)."""
    chosen = list(variants or loop_document["variants"])
    released = loop_document.get("released_races", {})  # absent in reports before 2026-12-07
    by_site: dict[str | None, list[dict[str, Any]]] = {None: [
        {"variant": v, "site": None, "code": None, "cpu_verdict": None, "delay": []}
        if not released.get(v) else  # the tree as released races: forced as a race row
        {"variant": v, "site": None, "code": None, "cpu_verdict": "race",
         "delay": earlier_streams(released[v]), "race_examples": released[v],
         "races_as_released": True}
        for v in chosen if (v, None) not in skip] + [
        row for row in twin_rows if row["variant"] in chosen]}
    for row in loop_document["rows"]:
        if row["real"] not in ("race", "race_free") or row["variant"] not in chosen \
                or (row["variant"], row["site"]) in skip:
            continue
        by_site.setdefault(row["site"], []).append({
            "variant": row["variant"], "site": row["site"], "code": row["code"],
            "cpu_verdict": row["real"], "delay": earlier_streams(row["race_examples"]),
            "race_examples": row["race_examples"],
            # a variant whose unmodified loop races: any delay may make that race, so a
            # wrong value of its redundant rows is not the removal's (report.summary)
            **({"races_as_released": True} if released.get(row["variant"]) else {})})
    return by_site


def planned_verdicts(loop_document: dict[str, Any], variants: Sequence[str] | None = None
                     ) -> dict[tuple[str, str | None], tuple[str | None, bool]]:
    """(variant, site) -> (the CPU verdict, races as released) each planned row runs under:
    a resumed report's row is kept only where they are the same (command._resumed)."""
    return {(row["variant"], row["site"]): plan_of(row)
            for rows in plan(loop_document, variants).values() for row in rows}


def plan_of(row: dict[str, Any]) -> tuple[str | None, bool]:
    """What a row's trials were forced for: its CPU verdict and whether its variant races as
    released (a row run under another plan is no evidence of this one)."""
    return row["cpu_verdict"], bool(row.get("races_as_released"))


def find_site(key: str) -> Any:
    """The loaded tree's sync site at ``key`` (``sglang/srt/x.py:LINE``, as the loop report
    names it): what a GPU trial, a repro and the CPU check of a row remove."""
    from overlap_harness.engines.sglang.report.path_sites import path_sites

    path, _, line = key.rpartition(":")
    for site in path_sites():
        if site.file.replace(os.sep, "/").endswith("/" + path) and site.line == int(line):
            return site
    raise LookupError(f"{key}: no sync site at that line in the loaded tree")


def _forcings_of(row: dict[str, Any], streams: list[str]) -> list[Any]:
    """A redundant row's (each stream at :data:`SWEEP_CYCLES`) or the unmodified loop's (no
    delay, then each stream at :data:`CONTROL_CYCLES`) forcings; a race row's are adaptive
    (:func:`_race_trials`)."""
    from overlap_harness.engines.sglang.gpu.loop import Forcing, forcings

    if row["site"] is None:
        return [Forcing(), *forcings([[s] for s in streams], CONTROL_CYCLES)]
    return forcings([[s] for s in streams], SWEEP_CYCLES)


def run_site(site_key: str | None, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """In this process: the serial answers of the rows' variants, then ``site_key`` removed,
    then each row's trials (see the module docstring)."""
    from overlap_harness.engines.core.mutation import Coverage, remove_site
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.gpu.access_values import (
        dirty_caches,
        side_locations,
        unstable_accesses,
    )
    from overlap_harness.engines.sglang.gpu.loop import Forcing, run_trial

    environment.load(os.environ.get("OVERLAP_HARNESS_SGLANG_SRC") or None)
    serial: dict[str, Any] = {}
    streams: dict[str, list[str]] = {}
    failed: dict[str, str] = {}
    sides: dict[str, list[str]] = {}  # each variant's race sides (their ops' values kept)
    for row in rows:
        for location in side_locations(row.get("race_examples", [])):
            if location not in sides.setdefault(row["variant"], []):
                sides[row["variant"]].append(location)
    for row in rows:
        if row["variant"] in serial or row["variant"] in failed:
            continue
        locations = sides.get(row["variant"], ())
        trial, values, seen = run_trial(row["variant"], Forcing(serial=True), None,
                                        access_locations=locations)
        if values is None:
            failed[row["variant"]] = f"serial run failed: {trial.error}"
        elif locations:  # the access values' control: what differs between two serial runs
            dirty_caches()  # memory an op leaves unwritten then differs
            again = run_trial(row["variant"], Forcing(serial=True), None,
                              access_locations=locations)[1]
            values["access_unstable"] = unstable_accesses(
                values["access"], again["access"]) if again is not None else [
                [location, None] for location in locations]
        serial[row["variant"]], streams[row["variant"]] = values, seen
    coverage = Coverage()
    site = undo = None
    if site_key is not None:
        try:
            site = find_site(site_key)
            undo = remove_site(site, coverage)
        except Exception as exc:  # the row says so; never dropped
            return [dict(row, error=f"{type(exc).__name__}: {exc}", trials=0) for row in rows]
    out: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if row["variant"] in failed:
            out.append(dict(row, error=failed[row["variant"]], trials=0))
            continue
        if row.get("twin_only"):  # an earlier report's row: its twins only (below)
            out.append(_twin_only(row, []))
            continue
        before = coverage.reached.get(site.key, 0) if site else 0
        if row["cpu_verdict"] == "race" and row["delay"]:
            trials = _race_trials(index, row, serial[row["variant"]])
        else:
            trials = []
            for forcing in _forcings_of(row, streams[row["variant"]]):
                _journal({"row": index, "starting": forcing.label()})
                trials.append(run_trial(row["variant"], forcing, serial[row["variant"]])[0])
                _journal({"row": index, "trial": asdict(trials[-1])})
        reached = (coverage.reached.get(site.key, 0) - before) // max(1, len(trials)) if site \
            else None
        out.append(_row(row, trials, reached))
    return _with_twins(rows, out, serial, undo)


def _with_twins(rows: list[dict[str, Any]], out: list[dict[str, Any]],
                serial: dict[str, Any], undo: Any) -> list[dict[str, Any]]:
    """The rows' twin trials (:mod:`.gpu.twins`), run after every row's own trials with the
    site put back (``undo``): each race row's trials that need one, each redundant row's
    trials that differed, and a twin-only row's ``twin_forcings``."""
    from overlap_harness.engines.sglang.gpu import twins

    pending = [(index, row, row["twin_forcings"] if row.get("twin_only")
                else twins.twin_labels(done))
               for index, (row, done) in enumerate(zip(rows, out, strict=True))
               if not done.get("error") and (done.get("twin_only") or row.get(
                   "cpu_verdict") in ("race", "race_free"))]
    pending = [(index, row, labels) for index, row, labels in pending if labels]
    if pending and undo is not None:
        undo()
    for index, row, labels in pending:
        out[index]["twin_trials"] = run_twins(index, row, labels, serial[row["variant"]])
    return out


def run_twins(index: int, row: dict[str, Any], labels: Sequence[str], serial: dict[str, Any]
              ) -> list[dict[str, Any]]:
    """Twin trials (gpu/twins.py) in the child, the site back in place: one trial per label,
    forced, probed and captured as the row's own trials were (:func:`_probed_trial`; a
    redundant row's as its sweep ran them, unprobed); journaled as ``twin`` so a child that
    dies keeps the ones that finished."""
    from overlap_harness.engines.sglang.gpu.loop import Forcing, parse_label, run_trial

    out = []
    for stream, targeted, cycles in filter(None, map(parse_label, labels)):
        forcing = Forcing((stream,), cycles, targeted=targeted)
        if row.get("cpu_verdict") == "race":
            out.append(asdict(_probed_trial(index, row, forcing, serial, twin=True)))
            continue
        _journal({"row": index, "twin_starting": forcing.label()})
        out.append(asdict(run_trial(row["variant"], forcing, serial)[0]))
        _journal({"row": index, "twin": out[-1]})
    return out


def _twin_only(row: dict[str, Any], twin_trials: list[dict[str, Any]]) -> dict[str, Any]:
    """What a twin-only row (:func:`twin_work`) gives back: its key and its twin trials
    (:func:`.gpu.twins.merged` adds them to the earlier report's row)."""
    return {key: row[key] for key in ("variant", "site", "code", "cpu_verdict")} | {
        "twin_only": True, "twin_trials": twin_trials}


def twin_work(kept: Sequence[dict[str, Any]], loop_document: dict[str, Any]
              ) -> list[dict[str, Any]]:
    """For a resumed run: the kept race rows whose trials need twins they lack, and the kept
    redundant rows whose differing trials lack theirs, as rows to run with nothing removed
    (``twin_only``; the loop report gives a race's sides)."""
    from overlap_harness.engines.sglang.gpu.twins import missing_twins

    examples = {(r["variant"], r["site"]): r.get("race_examples", [])
                for r in loop_document["rows"]}
    out = []
    for row in kept:
        labels = missing_twins(row) if row["site"] else []
        race = examples.get((row["variant"], row["site"]))
        if not labels or (row["cpu_verdict"] == "race" and not race):
            continue
        out.append({"variant": row["variant"], "site": row["site"], "code": row["code"],
                    "cpu_verdict": row["cpu_verdict"],
                    "delay": earlier_streams(race) if row["cpu_verdict"] == "race" else [],
                    "race_examples": race or [], "twin_only": True, "twin_forcings": labels})
    return out


def _race_trials(index: int, row: dict[str, Any], serial: dict[str, Any]) -> list[Any]:
    """A race row's trials, forced from the race itself: for each stream (or the host) of
    an earlier side, that side alone delayed, immediately before each of its ops, with a
    probe on the race's sides in every trial; the delay grows through :data:`RACE_CYCLES`
    until a trial shows a wrong value or crashes having made the race. Where the targeted
    delay holds nothing (the earlier side's op is not a dispatched op of that stream: a
    graph replay's, a launcher's), the whole stream is delayed instead. Where every delay
    held the earlier side and none showed a wrong value or a made crash, one more trial
    outlasts the host's own time between the sides, as the probe measured it
    (:func:`outlasting_cycles`): a delay shorter than that cannot make the race at all."""
    from overlap_harness.engines.sglang.gpu.loop import Forcing

    trials = []
    for stream in row["delay"]:
        targeted = True
        for cycles in RACE_CYCLES:
            while True:
                trial = _probed_trial(index, row, Forcing((stream,), cycles, targeted=targeted),
                                      serial)
                trials.append(trial)
                if trial.slept or not targeted or stream == "host":
                    break
                targeted = False  # nothing held at the earlier side: the whole stream
            # a crash the probe did not see make the race is no evidence (issue 45): the
            # delay grows on past it, as past a trial that equals the serial answer
            if trial.wrong or (trial.error and trial.race_made) or not trial.slept:
                break
        else:
            longer = further_cycles(trial, cycles, stream)
            if longer is not None:
                trials.append(_probed_trial(
                    index, row, Forcing((stream,), longer, targeted=targeted), serial))
    return trials


def _probed_trial(index: int, row: dict[str, Any], forcing: Any, serial: dict[str, Any],
                  twin: bool = False) -> Any:
    """One trial of a race row under ``forcing``, probed on the race's sides of its stream,
    with the values of both sides' ops; journaled before and after (a ``twin``'s under its
    own keys, :func:`from_journal`; the moment its probe sees the race made only for the
    row's own trials)."""
    from overlap_harness.engines.sglang.gpu.access_values import side_locations
    from overlap_harness.engines.sglang.gpu.loop import run_trial
    from overlap_harness.engines.sglang.gpu.probe import probes

    probe = probes(row["race_examples"], forcing.streams[0])
    label = forcing.label()
    if not twin:
        probe.on_made = lambda: _journal({"row": index, "made": label})
    _journal({"row": index, "twin_starting" if twin else "starting": label})
    trial = run_trial(row["variant"], forcing, serial, probe,
                      side_locations(row["race_examples"]))[0]
    _journal({"row": index, "twin" if twin else "trial": asdict(trial)})
    return trial


def outlasting_cycles(trial: Any, cycles: int) -> int | None:
    """The delay of one more trial after ``trial`` (held ``cycles`` and showed neither a
    wrong value nor a crash): long enough to outlast the host gaps its probe measured
    between an earlier side's op and a reach of the later side that found it finished (the
    last op's, ``least_done_gap_s``; the first op's since the previous reach,
    ``least_first_done_gap_s``: the op whose memory the later side touches may be any of
    them), at :data:`FASTEST_CLOCK_HZ`, twice over, as a power of two; None when the probe measured
    no such gap, when ``cycles`` already outlasts it, when it would exceed
    :data:`LONGEST_RACE_CYCLES`, or hold the trial longer than :data:`LONGEST_HELD_S` in all
    (the row then stays as its trials show it)."""
    counts = trial.probe or {}
    gap = max((counts[key] for key in ("least_done_gap_s", "least_first_done_gap_s")
               if counts.get(key) is not None), default=None)
    if gap is None:
        return None
    needed = max(1, int(2 * gap * FASTEST_CLOCK_HZ))
    longer = 1 << (needed - 1).bit_length()
    if longer <= cycles or longer > LONGEST_RACE_CYCLES:
        return None
    if counts.get("earlier_issued", 0) * longer / SLOWEST_CLOCK_HZ > LONGEST_HELD_S:
        return None
    return longer


def further_cycles(trial: Any, cycles: int, stream: str) -> int | None:
    """The delay of the one more trial a race row's last fixed-step trial on ``stream`` gets
    (held ``cycles``, showed neither a wrong value nor a made crash): one that outlasts the
    host gap its probe measured (:func:`outlasting_cycles`), else, where it made the race,
    the longest the hold budget allows (:func:`longest_held_cycles`); None for the host,
    which no sleep holds, and where neither applies. ``command.grows_further`` asks the same
    of an earlier report's rows."""
    if stream == "host":
        return None
    longer = outlasting_cycles(trial, cycles)
    if longer is None and trial.race_made:
        longer = longest_held_cycles(trial, cycles)
    return longer


def longest_held_cycles(trial: Any, cycles: int) -> int | None:
    """The delay of one more trial after ``trial`` (held ``cycles``, made the race, showed
    nothing) where the probe measured no gap to outlast: the longest power of two up to
    :data:`LONGEST_RACE_CYCLES` that holds the trial at most :data:`LONGEST_HELD_S` in all,
    or None when that is not longer than ``cycles``. Why: "made" is any op of the earlier
    side still pending when the later side ran, and where the earlier side is many ops (14
    D2H copies at ``common.py:615``) the one whose memory the later side touches may have
    landed. 2026-12-07's fifth session, without the prefill result's synchronize
    (batch_result_processor.py:268): every EAGLE row run from dirtied caches was made and
    equal at 2^23 cycles; 14 whose delay grew to 2^29-2^31 (a gap measured) showed a wrong
    token there, while the 3 whose probe measured no gap stayed at 2^25 and equal."""
    issued = max(1, (trial.probe or {}).get("earlier_issued", 0))
    longest = LONGEST_RACE_CYCLES
    while longest > cycles and issued * longest / SLOWEST_CLOCK_HZ > LONGEST_HELD_S:
        longest >>= 1
    return longest if longest > cycles else None


def _journal(entry: dict[str, Any]) -> None:
    """A line of the child's trial journal (``OVERLAP_HARNESS_GPU_JOURNAL``), written before
    and after each trial: if the child dies (a CUDA abort), the parent keeps its finished
    trials and names the one it died in."""
    path = os.environ.get("OVERLAP_HARNESS_GPU_JOURNAL")
    if path:
        with open(path, "a") as lines:
            lines.write(json.dumps(entry) + "\n")


def _row(row: dict[str, Any], trials: list[Any], reached: int | None) -> dict[str, Any]:
    """A row of the report from its trials: counts of the trials that held work back
    (``slept_trials``), made the race's order (``race_made_trials``, race rows: the probe),
    left a wrong value, crashed; a redundant or unmodified row none of whose trials held
    anything is ``not_exercised`` (no evidence either way)."""
    from overlap_harness.engines.sglang.gpu.probe import probes

    wrong = [t for t in trials if t.wrong is not None]
    crashed = [t for t in trials if t.error is not None]
    made = [t for t in trials if t.race_made]
    fields = {
        "variant": row["variant"], "site": row["site"], "code": row["code"],
        "cpu_verdict": row["cpu_verdict"], "trials": len(trials),
        "forced_delay": [t.forcing for t in trials],
        "slept_trials": sum(1 for t in trials if t.slept),
        "race_made_trials": len(made),
        "wrong_trials": len(wrong), "crashed_trials": len(crashed),
        "made_wrong_trials": sum(1 for t in made if t.wrong is not None),
        "made_crashed_trials": sum(1 for t in made if t.error is not None),
        "made_access_wrong_trials": sum(1 for t in made if t.access_wrong is not None),
        "access_wrong_unmade_trials": sum(1 for t in trials
                                          if t.access_wrong is not None and not t.race_made),
        "acceptance_wrong_trials": sum(1 for t in trials if t.acceptance_wrong is not None),
        "made_acceptance_wrong_trials": sum(1 for t in made if t.acceptance_wrong is not None),
        "example_acceptance_wrong": next((f"{t.forcing}: {t.acceptance_wrong}" for t in trials
                                          if t.acceptance_wrong is not None), None),
        "example_wrong": f"{wrong[0].forcing}: {wrong[0].wrong}" if wrong else None,
        "example_crash": f"{crashed[0].forcing}: {crashed[0].error}" if crashed else None,
        "example_access_wrong": next((f"{t.forcing}: {t.access_wrong}" for t in made
                                      if t.access_wrong is not None), None),
        "reached_per_trial": reached,
        "seconds": round(sum(t.seconds for t in trials), 2),
        "trial_details": [asdict(t) for t in trials],
    }
    if row.get("races_as_released"):  # the plan's mark, kept (report.summary counts by it)
        fields["races_as_released"] = True
    if row["cpu_verdict"] == "race":
        sides = [probes(row.get("race_examples", []), stream) for stream in row["delay"]]
        fields["probes"] = [{"stream": p.stream, "earlier": list(p.earlier),
                             "later": list(p.later)} for p in sides] \
            if "race_examples" in row else row.get("probes", [])
    else:
        fields["not_exercised"] = bool(trials) and not fields["slept_trials"]
    if wrong:
        fields["repro"] = repro_command(row["variant"], row["site"], wrong[0].forcing)
    return fields


def recounted(row: dict[str, Any]) -> dict[str, Any]:
    """A report row's counts recomputed from its trial details (a report written before a
    count existed gains it; nothing is run): the row's other keys (error, aborted) kept."""
    from overlap_harness.engines.sglang.gpu.loop import Trial

    if not row.get("trials"):
        return row
    trials = [Trial(**t) for t in row.get("trial_details", [])]
    meta = {**row, "delay": [p["stream"] for p in row.get("probes", [])]}
    fresh = _row(meta, trials, row.get("reached_per_trial"))
    kept = {k: v for k, v in row.items() if k not in fresh and k not in (
        "why", "why_reason", "not_exercised", "repro")}
    return {**kept, **fresh}


def settled(row: dict[str, Any]) -> bool:
    """The row is evidence as it stands, so a resumed run keeps it: a necessary row whose
    race was made and showed a wrong value or crashed in a made trial; a redundant row with
    a trial that held work back; the unmodified loop held at every delay of
    :data:`CONTROL_CYCLES` on each stream that held any. Every other row runs again."""
    from overlap_harness.engines.sglang.gpu.loop import parse_label

    if not row.get("trials") or row.get("error"):
        return False
    if row["cpu_verdict"] == "race":
        return bool(row.get("race_made_trials")) and bool(
            row["wrong_trials"] or row.get("made_crashed_trials"))
    if not row.get("slept_trials"):
        return False
    if row["cpu_verdict"] == "race_free":
        return True
    held: dict[str, set[int]] = {}
    for trial in row.get("trial_details", []):
        parsed = parse_label(trial["forcing"])
        if trial.get("sleeps") and parsed is not None:
            held.setdefault(parsed[0], set()).add(parsed[2])
    return all(set(CONTROL_CYCLES) <= cycles for cycles in held.values())


def repro_command(variant: str, site: str | None, forcing: str) -> str:
    """The command a maintainer runs on a GPU to see a wrong row's value: the variant with
    ``site`` removed, one forcing (the first trial that showed it)."""
    return (f"overlap-harness sglang --gpu --repro {variant} {site or '-'} "
            f"--repro-forcing {forcing.removesuffix('+probe')}")


def _child(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rows = run_site(spec["site"], spec["rows"])
    Path(out_path).write_text(json.dumps(rows))


def run_table(loop_document: dict[str, Any], variants: Sequence[str] | None, jobs: int,
              timeout_s: float, deadline_s: float = float("inf"),
              progress: Path | None = None,
              skip: frozenset[tuple[str, str | None]] = frozenset(),
              twin_rows: Sequence[dict[str, Any]] = ()
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """Every planned row, each site in a child process, ``jobs`` at a time (sites with the
    most rows first); the rows and the sites whose child failed (their rows kept, with the
    failure). Past ``deadline_s``, or on SIGTERM (a ``timeout``'s) or Ctrl-C, no child
    starts and running ones are stopped (their finished trials kept, the rest marked not run,
    with why), so the caller still writes its report; each finished site's rows are appended
    to ``progress`` (JSON lines) as they come."""
    work = pieces({site: rows for site, rows in plan(loop_document, variants, skip,
                                                     twin_rows).items()
                   if rows}, lightest_first=deadline_s != float("inf"))
    end = time.monotonic() + deadline_s
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    stop: list[str] = []  # why the run stops early: SIGTERM (a `timeout`) or Ctrl-C
    names = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}
    previous = {number: signal.signal(number, lambda got, frame: stop.append(names[got]))
                for number in names} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        return _run_pieces(work, jobs, timeout_s, end, progress, stop, rows, failures)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _run_pieces(work: list[tuple[str | None, list[dict[str, Any]]]], jobs: int,
                timeout_s: float, end: float, progress: Path | None, stop: list[str],
                rows: list[dict[str, Any]], failures: list[str]
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`run_table`'s loop. At the deadline, or when ``stop`` gets a reason (SIGTERM or
    Ctrl-C, :func:`run_table`'s handlers), running children are stopped (their finished
    trials kept from their journals) and every row not run says why: the report is written
    either way, nothing lost."""
    with tempfile.TemporaryDirectory() as scratch:
        running: list[tuple[subprocess.Popen[bytes], str | None, list[dict[str, Any]], str,
                            float]] = []
        index = 0
        while work or running:
            if time.monotonic() > end or stop:
                why = "the run's deadline" if not stop else f"the run was stopped ({stop[0]})"
                for _, site, _, _, _ in running:
                    failures.append(f"{site}: stopped at the deadline" if not stop
                                    else f"{site}: stopped ({stop[0]})")
                for child, *_ in running:  # all killed first: a child's CUDA teardown
                    child.kill()  # may wait for its queued delays, and one at a time those
                for child, *_ in running:  # waits add up (a stop took ~80 s, 2026-12-07)
                    child.communicate()
                for _, _, site_rows, out, _ in running:  # their finished trials kept
                    _add(rows, from_journal(site_rows, _journal_of(out), f"not run: {why}",
                                            False), progress)
                rows.extend(dict(r, error=f"not run: {why}", trials=0)
                            for _, site_rows in work for r in site_rows)
                break
            while work and len(running) < max(1, jobs):
                site, site_rows = work.pop(0)
                spec = Path(scratch, f"spec{index}.json")
                out = str(Path(scratch, f"out{index}.json"))
                index += 1
                spec.write_text(json.dumps({"site": site, "rows": site_rows}))
                journal = _journal_of(out)
                child = subprocess.Popen(
                    [sys.executable, "-m", __name__, str(spec), out],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    env={**os.environ, "OVERLAP_HARNESS_GPU_JOURNAL": str(journal)},
                    start_new_session=True)  # a terminal's Ctrl-C reaches the parent only
                running.append((child, site, site_rows, out, time.monotonic()))
            time.sleep(0.2)
            for entry in list(running):
                child, site, site_rows, out, started = entry
                late = time.monotonic() - started > timeout_s
                if child.poll() is None and not late:
                    continue
                if late:
                    child.kill()
                running.remove(entry)
                _, err = child.communicate()
                if child.returncode == 0 and Path(out).is_file():
                    done = json.loads(Path(out).read_text())
                    _add(rows, done, progress)
                    print(f"  {site or 'unmodified'}: {len(done)} rows "
                          f"({time.monotonic() - started:.0f} s)", flush=True)
                    continue
                why = "timed out" if late else \
                    f"exit {child.returncode}: {abort_reason(err.decode(errors='replace'))}"
                if len(site_rows) > 1 and not late:
                    # one child per row of the site: an abort then loses one row's trials only
                    print(f"  {site}: {why}; again, one child per variant", flush=True)
                    failures.append(f"{site}: {why} (its rows run again, one child per "
                                    "variant)")
                    work[:0] = [(site, [r]) for r in site_rows]
                    continue
                failures.append(f"{site}: {why}")
                _add(rows, from_journal(site_rows, _journal_of(out), f"child failed: {why}"),
                     progress)
    return rows, failures


def _add(rows: list[dict[str, Any]], done: list[dict[str, Any]], progress: Path | None
         ) -> None:
    """``done`` rows added to ``rows`` and, where they ran a trial or a twin, appended to
    ``progress`` (JSON lines): a run stopped before its report, or whose report could not
    come back, is rebuilt from them (tools/sglang_gpu_recount.py --progress), a died or
    stopped child's rows included."""
    rows.extend(done)
    ran = [row for row in done if row.get("trials") or row.get("twin_trials")]
    if progress is not None and ran:
        with progress.open("a") as lines:
            lines.writelines(json.dumps(row) + "\n" for row in ran)


#: rows of one site per child at most (a site's rows run one after another in its child)
ROWS_PER_CHILD = 5
#: a row of a spec-decoding variant weighs this many rows in the order children start
SPEC_WEIGHT = 4


def pieces(by_site: dict[str | None, list[dict[str, Any]]], lightest_first: bool = False
           ) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """The children's work: each site's rows in pieces of at most :data:`ROWS_PER_CHILD`,
    the heaviest first (an EAGLE variant's trials take several times a non-spec one's: the
    run ends soonest), or the lightest first (under a deadline: the most rows finish)."""
    out = [(site, rows[i:i + ROWS_PER_CHILD]) for site, rows in by_site.items()
           for i in range(0, len(rows), ROWS_PER_CHILD)]

    def weight(piece: tuple[str | None, list[dict[str, Any]]]) -> int:
        return sum(SPEC_WEIGHT if "eagle" in r["variant"] else 1 for r in piece[1])

    return sorted(out, key=lambda piece: weight(piece) if lightest_first else -weight(piece))


def _journal_of(out: str) -> Path:
    """The trial journal beside a child's output file (``outN.json`` -> ``journalN.jsonl``)."""
    return Path(out).with_name(Path(out).name.replace("out", "journal", 1)).with_suffix(
        ".jsonl")


def abort_reason(stderr: str) -> str:
    """The line of a dead child's error output that says why: a C++ exception's ``what():``,
    a CUDA error, a Python exception; else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for marker in ("what():", "CUDA error", "Error:", "Error", "terminate called"):
        for number, line in enumerate(lines):
            if marker in line:
                following = lines[number + 1] if marker == "what():" and \
                    line.endswith("what():") and number + 1 < len(lines) else ""
                return (line + " " + following).strip()[:400]
    return lines[-1][:400] if lines else "no output"


def from_journal(site_rows: list[dict[str, Any]], journal: Path, why: str,
                 died_in_trial: bool = True) -> list[dict[str, Any]]:
    """The rows of a child that died (or was stopped: ``died_in_trial`` False), from its
    trial journal: each row's finished trials, and the trial it died in as a crashed trial
    with ``why``; a row none of whose trials finished or started keeps ``why`` as its
    error."""
    from overlap_harness.engines.sglang.gpu.loop import Trial

    finished: dict[int, list[Any]] = {}
    started: dict[int, str] = {}
    made: dict[int, str] = {}
    twins: dict[int, list[dict[str, Any]]] = {}  # twin trials (gpu.twins), finished or
    twin_started: dict[int, str] = {}  # the one it died in
    if journal.is_file():
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            if "twin" in entry:
                twins.setdefault(entry["row"], []).append(entry["twin"])
                twin_started.pop(entry["row"], None)
            elif "twin_starting" in entry:
                twin_started[entry["row"]] = entry["twin_starting"]
            elif "trial" in entry:
                finished.setdefault(entry["row"], []).append(Trial(**entry["trial"]))
                started.pop(entry["row"], None)
                made.pop(entry["row"], None)
            elif "made" in entry:
                made[entry["row"]] = entry["made"]
            else:
                started[entry["row"]] = entry["starting"]
    out = []
    for index, row in enumerate(site_rows):
        twin_trials = twins.get(index, []) + [
            asdict(Trial(label, error=why)) for label in [twin_started.get(index)]
            if label and died_in_trial]
        if row.get("twin_only"):
            out.append(_twin_only(row, twin_trials))
            continue
        # the trial it died in: crashed; it held work back and made the race if the probe
        # journalled that before the abort (``made``), else neither is known
        trials = finished.get(index, []) + [
            Trial(label, error=why, sleeps=int(index in made),
                  probe={"later_pending": 1} if index in made else None)
            for label in [started.get(index)] if label and died_in_trial]
        if not trials:
            out.append(dict(row, error=why, trials=0))
            continue
        out.append(dict(_row(row, trials, None), aborted=why,
                        **({"twin_trials": twin_trials} if twin_trials else {})))
    return out


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
