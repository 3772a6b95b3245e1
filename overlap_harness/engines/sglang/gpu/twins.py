"""Twin trials: a race row's forcing run again on the unmodified code, its control.

The unmodified loop's own control (gpu.table) runs each stream it holds at the fixed delays,
before every op. Five kinds of evidence lie outside it:

- a wrong value or a made crash shown only at an escalated delay (``table.outlasting_cycles``:
  2^27-2^31 cycles before the earlier side's ops): the unmodified loop never ran that long;
- a value that differs only at the race's own access or in the acceptance record
  (``access_values``, ``loop.observe``): the unmodified loop captures neither;
- any evidence of a variant whose tree as released races (``races_as_released``): its
  unmodified loop is forced as a race row itself, no control;
- a redundant row's trial that did not stay equal (a wrong value, a crash): its twin says
  whether the removal made the difference (a CPU verdict to check) or the forcing alone did
  (in a variant that races as released, that race);
- any evidence of a trial that started from dirtied caches (``Trial.dirtied``,
  ``access_values.dirty_caches``): the unmodified loop's control trials of the earlier
  report did not.

So such a trial gets its twin: the same forcing (stream, targeted lines, cycles), the same
probe and the same captured lines, on the tree with the row's site back in place. A twin
equal to the serial answer everywhere (output, access values, acceptance record) says the
difference is the removal's; a twin that differs says the forcing alone makes it, and the
row's evidence does not count (:func:`controlled`). Twins run in the race row's own child
after its trials, the removal undone, or, for a row an earlier report already holds, in a
child of their own with nothing removed (``table.twin_work``; ``table.run_twins`` runs
them).
"""

from __future__ import annotations

from typing import Any


def made(trial: dict[str, Any]) -> bool:
    """The trial record's probe saw the later side run while the earlier side's work was
    pending (``Trial.race_made`` of a report's ``trial_details`` entry)."""
    return bool((trial.get("probe") or {}).get("later_pending"))


def wrong_or_made_crash(trial: dict[str, Any]) -> bool:
    """The trial record left a wrong value, or crashed having made the race: the evidence
    issue 45's aim counts (an access value or acceptance record aside, :func:`shown`)."""
    return bool(trial.get("wrong")) or bool(trial.get("error") and made(trial))


def needs_twin(trial: dict[str, Any], released: bool = False) -> bool:
    """A trial (a report's ``trial_details`` entry) whose evidence no fixed control covers:
    it held work back and showed a wrong value or a made crash at an escalated delay (at any
    delay where the variant races as released, ``released``, or where the trial started from
    dirtied caches), or made the race and differed only at an access or in the acceptance
    record."""
    from overlap_harness.engines.sglang.gpu.delays import RACE_CYCLES
    from overlap_harness.engines.sglang.gpu.loop import parse_label

    parsed = parse_label(trial["forcing"])
    if parsed is None or not trial.get("sleeps"):
        return False
    if wrong_or_made_crash(trial):
        return released or bool(trial.get("dirtied")) or parsed[2] > RACE_CYCLES[-1]
    return made(trial) and not trial.get("error") and bool(
        trial.get("access_wrong") or trial.get("acceptance_wrong"))


def twin_labels(row: dict[str, Any]) -> list[str]:
    """The forcings of the row's trials that need a twin, each once, in trial order; none
    for a row without a site (a released race's own unmodified loop): nothing to put back,
    its twin would be the same run again, so its evidence stays without a control."""
    if row.get("site") is None:
        return []
    if row.get("cpu_verdict") == "race_free":  # a redundant row's difference: whose is it?
        return list(dict.fromkeys(t["forcing"] for t in row.get("trial_details", [])
                                  if t.get("sleeps") and differs(t)))
    released = bool(row.get("races_as_released"))
    return list(dict.fromkeys(t["forcing"] for t in row.get("trial_details", [])
                              if needs_twin(t, released)))


def missing_twins(row: dict[str, Any]) -> list[str]:
    """The row's twin forcings that its ``twin_trials`` do not hold yet."""
    have = {t["forcing"] for t in row.get("twin_trials", [])}
    return [label for label in twin_labels(row) if label not in have]


def shown(trial: dict[str, Any]) -> bool:
    """The trial shows the race: a wrong value, or, where it made the race, a crash or a
    different access value or acceptance record."""
    return bool(trial.get("wrong")) or (made(trial) and any(
        trial.get(key) for key in ("error", "access_wrong", "acceptance_wrong")))


def differs(trial: dict[str, Any]) -> bool:
    """The twin did not finish equal to the serial answer in everything compared."""
    return any(trial.get(key) for key in ("wrong", "error", "access_wrong",
                                          "acceptance_wrong"))


def controlled(row: dict[str, Any], trial: dict[str, Any]) -> bool:
    """``trial``'s evidence stands: it needs no twin, or its twin ran and stayed equal (a
    row without a site has no twin: :func:`twin_labels`)."""
    if not needs_twin(trial, bool(row.get("races_as_released"))):
        return True
    if row.get("site") is None:
        return False
    twins = [t for t in row.get("twin_trials", []) if t["forcing"] == trial["forcing"]]
    return bool(twins) and not any(differs(t) for t in twins)


def merged(kept: list[dict[str, Any]], ran: list[dict[str, Any]]
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kept rows with the twin trials of ``ran``'s twin-only rows added, and ``ran``'s
    other rows; a twin-only row that did not finish adds nothing (its row keeps
    :func:`missing_twins`)."""
    twins: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    rows = []
    for row in ran:
        if row.get("twin_only"):
            twins.setdefault((row["variant"], row["site"]), []).extend(
                row.get("twin_trials", []))
        else:
            rows.append(row)
    out = []
    for row in kept:
        extra = twins.get((row["variant"], row["site"]))
        out.append({**row, "twin_trials": [*row.get("twin_trials", []), *extra]} if extra
                   else row)
    return out, rows
