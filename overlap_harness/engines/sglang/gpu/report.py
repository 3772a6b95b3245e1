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

from overlap_harness.engines.sglang.gpu import twins

#: a necessary row without a wrong value says why in ``why`` (its key in ``why_reason``)
NO_WRONG_REASONS = {
    "wrong_acceptance": "the race was made (probe) and the requests' acceptance record "
                        "(SGLang's spec_verify_ct, spec_num_correct_drafts, the acceptance "
                        "histogram) differs from the serial run's: a corrupted draft costs "
                        "accepted tokens (throughput) while the target's verify keeps the "
                        "output right",
    "wrong_at_access": "the race was made (probe) and the value at its own access differs "
                       "from the serial run's (access_values); it is overwritten or not read "
                       "before it reaches the compared buffers",
    "overwritten": "the race was made (probe), but the corrupted value is overwritten or not "
                   "read before it reaches the compared buffers",
    "timing": "the race needs a timing the delay of its earlier side cannot make (probe)",
    "crashed": "a forced trial that made the race (probe) crashed: the race broke the loop "
               "instead of finishing with a wrong value",
    "unprobed": "every forced trial equals the serial answer or crashed; no probe answered",
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
        row.setdefault("slept_trials", 0)  # a row whose trials did not run held nothing
        row.setdefault("race_made_trials", 0)
        row.setdefault("example_wrong", None)
        if row["cpu_verdict"] == "race" and not row["wrong_trials"]:
            row["why_reason"], row["why"] = _why_no_wrong(row)
    return {"sglang_version": version, "device": device, "torch": torch_version, "date": date,
            "command": command, "seconds": round(seconds, 1), "child_failures": failures,
            "summary": summary(rows), "rows": rows}


def _why_no_wrong(row: dict[str, Any]) -> tuple[str, str]:
    """Why a necessary row shows no wrong value, computed from what its trials did (never
    hand-written): not run; a trial that made the race crashed; one that made it and left a
    wrong value at the race's own access (``wrong_at_access``); else the probes' finding
    (gpu_probe.why_equal) of each probed trial: ``overwritten`` if any made the race, else
    ``timing`` (the finding of the trial with the largest delay)."""
    from overlap_harness.engines.sglang.gpu.loop import parse_label
    from overlap_harness.engines.sglang.gpu.probe import why_equal

    if not row["trials"]:
        return "not_run", f"{NO_WRONG_REASONS['not_run']} ({row.get('error') or 'no trials'})"
    if row.get("made_crashed_trials"):
        return "crashed", (f"{row['made_crashed_trials']} of {row['trials']} forced trials "
                           f"made the race and crashed instead of finishing with a wrong value "
                           f"({row.get('example_crash')}); the others equal the serial answer")
    if row.get("made_acceptance_wrong_trials"):
        made = next((t for t in row.get("trial_details", []) if t.get("acceptance_wrong")
                     and twins.made(t)), {})
        return "wrong_acceptance", (
            f"{row['made_acceptance_wrong_trials']} of {row['trials']} forced trials made the "
            f"race and left the requests' acceptance record different from the serial run's "
            f"({made.get('forcing')}: {made.get('acceptance_wrong')}); output_ids and "
            f"req_to_token equal the serial answer: a corrupted draft cost accepted tokens, "
            f"the target's verify kept the output right")
    if row.get("made_access_wrong_trials"):
        return "wrong_at_access", (
            f"{row['made_access_wrong_trials']} of {row['trials']} forced trials made the race "
            f"and left a value at its own access different from the serial run's "
            f"({row.get('example_access_wrong')}); output_ids and req_to_token equal the "
            f"serial answer: the corrupted value is overwritten or not read before them")
    sides = {p["stream"]: p for p in row.get("probes", [])}
    unknown = {"stream": "?", "earlier": [], "later": []}
    found = [why_equal(t["probe"], sides.get((parse_label(t["forcing"]) or ("?",))[0], unknown))
             for t in row.get("trial_details", []) if t.get("probe") and "earlier_issued"
             in t["probe"]]
    if not found:
        died = [t for t in row.get("trial_details", []) if t.get("error")]
        if died:  # the child died before any probe could count: made or not, unknown
            return "unprobed", (
                f"no probe answered: {len(died)} of {row['trials']} forced trials crashed "
                f"before their probe could count ({died[0]['forcing']}: "
                f"{died[0]['error']}); whether the race was made is not known")
        return "unprobed", NO_WRONG_REASONS["unprobed"]
    crashed = (f"; {row['crashed_trials']} crashed without the probe seeing the race made "
               f"({row.get('example_crash')})") if row.get("crashed_trials") else ""
    made = [text for key, text in found if key == "overwritten"]
    key, text = ("overwritten", made[0]) if made else ("timing", found[-1][1])
    declined = sorted({name for t in row.get("trial_details", [])
                       for name in t.get("declared_kernel_calls") or {}
                       if name.endswith("(declined)")})
    if declined and key == "timing":  # the device took another path than the kernel's line
        text += f"; declared kernels that declined to launch: {', '.join(declined)}"
    delays = ", ".join(sorted(set(row.get("forced_delay", []))))
    return key, f"all {row['trials']} forced trials ({delays}) equal the serial answer" \
        f"{crashed}; {text}"


def crashed_control(row: dict[str, Any]) -> bool:
    """A control (a redundant row, an unmodified loop) none of whose trials differed from
    the serial answer but one of which crashed: no bit-identical row (:func:`summary`'s
    ``*_crashed``), and a resumed run runs its sweep again in any mode (``command._resumed``;
    the 2026-12-07 report held 7, each crashed while SGLang captured a CUDA graph, before
    any delay was issued)."""
    return (row["cpu_verdict"] != "race" and bool(row.get("trials"))
            and not row.get("wrong_trials") and bool(row.get("crashed_trials")))


def summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Counts: necessary rows with a wrong value, made races, redundant rows all equal (of
    those exercised), and so on."""
    def count(verdict: str | None, wrong: bool, released: bool = False) -> int:
        # a crashed control is no bit-identical row: counted apart (``*_crashed``)
        return sum(1 for r in rows if r["cpu_verdict"] == verdict and r["trials"]
                   and not r.get("error") and bool(r["wrong_trials"]) == wrong
                   and not r.get("not_exercised")
                   and bool(r.get("races_as_released")) == released
                   and not crashed_control(r))

    def crashed(verdict: str | None) -> int:
        return sum(1 for r in rows if r["cpu_verdict"] == verdict and crashed_control(r)
                   and not r.get("error") and not r.get("not_exercised"))
    necessary = [r for r in rows if r["cpu_verdict"] == "race" and r["trials"]]
    return {"rows": len(rows),
            "race_rows_wrong": count("race", True) + count("race", True, released=True),
            "race_rows_all_equal": count("race", False) + count("race", False, released=True),
            "race_rows_made": sum(1 for r in necessary if r.get("race_made_trials")),
            "race_rows_wrong_or_made_crash": sum(
                1 for r in necessary if r["wrong_trials"] or r.get("made_crashed_trials")),
            # ... or, in a trial that made the race, a different acceptance record or a
            # different value at the race's own access (its controls below)
            "race_rows_value_shown": sum(
                1 for r in necessary if r["wrong_trials"] or r.get("made_crashed_trials")
                or r.get("made_acceptance_wrong_trials") or r.get("made_access_wrong_trials")),
            "race_free_rows_all_equal": count("race_free", False)
            + count("race_free", False, released=True),
            "race_free_rows_wrong": count("race_free", True),
            # ... of a variant whose unmodified loop races (races_as_released): its delays
            # can make that race, so a wrong value is not the removal's
            "race_free_rows_wrong_released": count("race_free", True, released=True),
            "race_free_rows_not_exercised": sum(
                1 for r in rows if r["cpu_verdict"] == "race_free" and r.get("not_exercised")),
            # ... and those none of whose trials differed but one crashed (a control that
            # did not finish is no control: crashed_control)
            "race_free_rows_crashed": crashed("race_free"),
            "unmodified_all_equal": count(None, False), "unmodified_wrong": count(None, True),
            "unmodified_crashed": crashed(None),
            "unmodified_not_exercised": sum(
                1 for r in rows if r["cpu_verdict"] is None and r.get("not_exercised")),
            "errors": sum(1 for r in rows if r.get("error")),
            # timing rows held against the CPU mode (gpu/cpu_check.py), and those where the
            # device met an ordering the CPU mode does not record
            "timing_rows_cpu_checked": sum(1 for r in rows if r.get("why_reason") == "timing"
                                           and r.get("cpu_verdict_checked")),
            "timing_rows_cpu_misses": sum(1 for r in rows if r.get("why_reason") == "timing"
                                          and (r.get("cpu_verdict_checked") or {}).get(
                                              "cpu_misses")),
            # ... of which every wrong or made-crashed trial held a delay past the fixed
            # steps (table.outlasting_cycles), which the unmodified loop's control lacks
            "race_rows_wrong_only_escalated": sum(
                1 for r in necessary if (r["wrong_trials"] or r.get("made_crashed_trials"))
                and _only_escalated(r)),
            # the acceptance record's control: rows whose trials made no race (redundant,
            # unmodified; not of a variant that races as released) yet differ there
            "race_free_rows_acceptance_wrong": sum(
                1 for r in rows if r["cpu_verdict"] != "race" and r.get("acceptance_wrong_trials")
                and not r.get("races_as_released")),
            "acceptance_wrong_unmade_trials": sum(
                r.get("acceptance_wrong_trials", 0) - r.get("made_acceptance_wrong_trials", 0)
                for r in necessary),
            # the access oracle's control: trials that did not make the race yet differ there
            "access_wrong_unmade_trials": sum(r.get("access_wrong_unmade_trials", 0)
                                              for r in rows),
            # twin trials (gpu/twins.py): a race row's forcing on the unmodified code, the
            # control of what the fixed one does not cover; those that did not stay equal
            "twin_trials": sum(len(r.get("twin_trials", [])) for r in rows),
            "twin_trials_differing": sum(1 for r in rows for t in r.get("twin_trials", [])
                                         if twins.differs(t)),
            # rows with evidence that still needs its twin (not run yet)
            "race_rows_twin_missing": sum(1 for r in necessary if twins.missing_twins(r)),
            # a wrong value, a made crash, or, in a made trial, a different acceptance record
            # or access value, whose control stayed equal: the fixed control of the
            # unmodified loop, or the trial's own twin
            "race_rows_value_shown_controlled": sum(
                1 for r in necessary if any(twins.shown(t) and twins.controlled(r, t)
                                            for t in r.get("trial_details", []))),
            # redundant rows that differed, by what their twins (the site put back, the
            # same forcing) showed: differed too (the forcing alone, in a variant that races
            # as released its own race) or stayed equal (the removal's: a CPU verdict to check)
            "race_free_rows_wrong_twin_differs": sum(
                1 for r in rows if r["cpu_verdict"] == "race_free" and r.get("twin_trials")
                and any(twins.differs(t) for t in r["twin_trials"])),
            "race_free_rows_wrong_twin_equal": sum(
                1 for r in rows if r["cpu_verdict"] == "race_free" and r.get("twin_trials")
                and not any(twins.differs(t) for t in r["twin_trials"])),
            # trials that started from dirtied caches (access_values.dirty_caches; every
            # forced trial since 2026-12-07's fifth session), twins included
            "trials_dirtied": sum(1 for r in rows for t in [*r.get("trial_details", []),
                                                          *r.get("twin_trials", [])]
                                  if t.get("dirtied")),
            **{f"race_rows_why_{key}": sum(1 for r in rows if r.get("why_reason") == key)
               for key in NO_WRONG_REASONS}}


def _only_escalated(row: dict[str, Any]) -> bool:
    """Every trial of the row that was wrong, or made the race and crashed, held a delay
    longer than the fixed steps' longest (:data:`.gpu.delays.RACE_CYCLES`)."""
    from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
    from overlap_harness.engines.sglang.gpu.loop import parse_label

    shown = [t for t in row.get("trial_details", []) if twins.wrong_or_made_crash(t)]
    return bool(shown) and all(
        (parse_label(t["forcing"]) or ("", False, 0))[2] > RACE_CYCLES[-1] for t in shown)


def problems(report: dict[str, Any], loop_report: dict[str, Any]) -> list[str]:
    """What in ``report`` disagrees with ``loop_report`` or with itself (empty: consistent)."""
    real = {(r["variant"], r["site"]): r["real"] for r in loop_report["rows"]}
    out = []
    if report["sglang_version"] != loop_report["sglang_version"]:
        out.append(f"version {report['sglang_version']} != {loop_report['sglang_version']}")
    for row in report["rows"]:
        where = f"{row['variant']} {row['site']}"
        released = loop_report.get("released_races", {}).get(row["variant"])
        if row["site"] is None and (row["cpu_verdict"] == "race") != bool(released):
            out.append(f"{where}: the unmodified loop's cpu_verdict {row['cpu_verdict']} but "
                       f"the loop report lists {len(released or [])} released races")
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
        if row.get("why_reason") == "timing" and not row.get("cpu_verdict_checked"):
            out.append(f"{where}: a timing row without cpu_verdict_checked (overlap-harness "
                       "sglang --gpu-check-cpu)")
        if row["trials"] and "slept_trials" in row:
            out.extend(_trial_count_problems(row, where))
    judged = {(v, s) for (v, s), verdict in real.items() if verdict in ("race", "race_free")}
    present = {(r["variant"], r["site"]) for r in report["rows"] if r["site"] is not None}
    variants = {r["variant"] for r in report["rows"]}
    for key in sorted(judged - present, key=str):
        if key[0] in variants:
            out.append(f"{key[0]} {key[1]}: judged in the loop report, no row here")
    return out


def _trial_count_problems(row: dict[str, Any], where: str) -> list[str]:
    """The row's trial counts recomputed from its trial details."""
    details = row.get("trial_details", [])
    slept = sum(1 for t in details if t.get("sleeps"))
    made = sum(1 for t in details if twins.made(t))
    out = []
    if slept != row["slept_trials"] or made != row["race_made_trials"]:
        out.append(f"{where}: slept/made {row['slept_trials']}/{row['race_made_trials']} but "
                   f"its trials say {slept}/{made}")
    if row["cpu_verdict"] != "race" and row.get("not_exercised") != (slept == 0):
        out.append(f"{where}: not_exercised disagrees with its {slept} slept trials")
    if row["wrong_trials"] and not row.get("repro"):
        out.append(f"{where}: a wrong row without a repro")
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
        f"without: {s['race_rows_all_equal']}; race made (the probe saw the later side run "
        f"while the earlier side's work was pending) in {s.get('race_rows_made', '?')}, a "
        f"wrong value or a crash of a race-made trial in "
        f"{s.get('race_rows_wrong_or_made_crash', '?')}; redundant rows (race_free) "
        f"bit-identical in every trial, with a trial that held work back: "
        f"{s['race_free_rows_all_equal']}, not exercised (no trial held anything): "
        f"{s.get('race_free_rows_not_exercised', '?')}, with a wrong value: "
        f"{s['race_free_rows_wrong']} (and {s.get('race_free_rows_wrong_released', 0)} of "
        "variants that race as released: a delay there can make the released race, which "
        "the unmodified loop's race row shows); unmodified loop bit-identical: "
        f"{s['unmodified_all_equal']} variants, not exercised: "
        f"{s.get('unmodified_not_exercised', '?')}, wrong: {s['unmodified_wrong']}; controls "
        "none of whose trials differed but one crashed (no bit-identical row): "
        f"{s.get('race_free_rows_crashed', '?')} redundant, "
        f"{s.get('unmodified_crashed', '?')} unmodified; rows with an error: {s['errors']}.",
        "",
        "Necessary rows without a wrong value, by the computed why (`why_reason`; "
        "gpu/probe.py): " + ", ".join(f"{key} {s.get('race_rows_why_' + key, 0)}"
                                      for key in NO_WRONG_REASONS) + ".",
        "",
        "Timing rows checked against the CPU mode (`cpu_verdict_checked`, gpu/cpu_check.py): "
        f"{s.get('timing_rows_cpu_checked', 0)} of {s.get('race_rows_why_timing', 0)}; with "
        f"an ordering the CPU mode does not record: {s.get('timing_rows_cpu_misses', 0)}.",
        "",
        "Of the rows with a wrong value or a made crash, shown only at an escalated delay (past "
        "the fixed steps; no unmodified control of that length): "
        f"{s.get('race_rows_wrong_only_escalated', 0)}. Necessary rows with a wrong value, a "
        "made crash, or, in a made trial, a different acceptance record or access value: "
        f"{s.get('race_rows_value_shown', '?')}. Controls: redundant and unmodified rows with a "
        f"different acceptance record {s.get('race_free_rows_acceptance_wrong', '?')}; trials "
        "that did not make their race yet differ in the acceptance record "
        f"{s.get('acceptance_wrong_unmade_trials', '?')}, at an access "
        f"{s.get('access_wrong_unmade_trials', '?')}.",
        "",
        "Twin trials (a race row's forcing on the unmodified code, where the fixed control "
        "does not cover its evidence: an escalated delay, dirtied caches, a value at an "
        f"access or in the acceptance record; gpu/twins.py): {s.get('twin_trials', 0)}, of "
        "which differ from "
        f"the serial answer {s.get('twin_trials_differing', 0)}; rows still waiting for a "
        f"twin {s.get('race_rows_twin_missing', 0)}. Necessary rows with a value shown whose "
        "control stayed equal (the fixed control of the unmodified loop, or, where that does "
        "not cover it, the trial's twin; a variant that races as released has no fixed "
        f"control): {s.get('race_rows_value_shown_controlled', 0)}. Trials that started from "
        "dirtied caches (device and page-locked host blocks filled with a pattern, so a read "
        "before its write lands never finds an earlier run's right answer; their evidence "
        f"needs a twin): {s.get('trials_dirtied', 0)}. Redundant rows that differed, with "
        "twins (the site put back, the same forcing): the twin differed too (the forcing "
        f"alone) {s.get('race_free_rows_wrong_twin_differs', 0)}, the twin stayed equal (the "
        f"removal's: a CPU verdict to check) {s.get('race_free_rows_wrong_twin_equal', 0)}.",
        "",
        "| variant | site | code | cpu_verdict | trials | slept | made | forced_delay | "
        "wrong_trials | example wrong value / why |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        delays = ", ".join(sorted(set(row.get("forced_delay", []))))
        note = row["example_wrong"] or row.get("why") or row.get("error") or (
            "not exercised: no trial's delay held an op" if row.get("not_exercised") else "")
        if row.get("races_as_released") and row["cpu_verdict"] == "race_free" \
                and row["wrong_trials"]:
            note = f"the variant races as released (a delay can make that race): {note}"
        checked = row.get("cpu_verdict_checked")
        note = _cell(note) + (f" CPU verdict checked: {_cell(checked['finding'])}."
                              if checked else "")
        if row.get("error") and row["example_wrong"] is None:
            note = _cell(f"error: {row['error']}")
        code = f"`{row['code']}`" if row["code"] else "(unmodified loop)"
        lines.append(f"| {row['variant']} | {row['site'] or '-'} | {code} | "
                     f"{row['cpu_verdict'] or '-'} | {row['trials']} | "
                     f"{row.get('slept_trials', '-')} | {row.get('race_made_trials', '-')} | "
                     f"{delays} | "
                     f"{row['wrong_trials']} | {note} |")
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
