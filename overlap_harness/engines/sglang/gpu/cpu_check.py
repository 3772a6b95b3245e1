"""The CPU mode's verdict held against a GPU row whose race the forcing could not make.

A ``timing`` row (:func:`.gpu.probe.why_equal`) is a necessary row where the device always
found the race's earlier side finished when the later side came, with the calls that ran
between the two sides and could order them (the probe's ``orderings``: a wait, a
synchronize, a blocking copy, a host read). Either the forcing was too weak, or an ordering
the CPU mode does not see made the race impossible. This module says which, per row: the
variant runs again in CPU mode with the row's site removed (SGLang's own loop under the
recorder, as the loop report ran it), and each ordering call is looked up among the ops the
recorder recorded at that line:

- ``instrument``: the GPU mode's own snapshot of a side's values (gpu/access_values.py: a
  non-blocking copy on the op's own stream, no host wait).
- ``stand_in``: the call is in the harness's own stand-in code (``overlap_harness/...``): if
  it waits for the device (a host read, a blocking copy, not a dtype conversion on the
  device: the probe knows only the call's name), a wait SGLang's own code does not make; it
  orders the device run only.
- ``recorded``: an SGLang line the CPU mode recorded (as a copy, a wait, a host sync ...):
  the CPU verdict already accounts for it, and the detector still finds the race.
- ``inside_library``: a frame inside torch or Triton below another listed call (the recorder
  names the caller's line, listed on its own).
- ``allocator``: ``record_stream``, which the CPU mode keeps in its allocator model (a
  block's reuse waits for the stream): no ordering of two ops.
- ``no_device_op``: a data call (``.to``, ``copy_``, ``tolist`` ...) at a line where the CPU
  mode, which records every op on device memory, recorded none: a host tensor's or a no-op
  conversion, no ordering.
- ``missed``: a synchronisation call (a wait, a synchronize, a query) at an SGLang line
  where the CPU mode recorded nothing: an ordering the CPU mode may miss. The row's
  ``cpu_verdict_checked`` says so (``cpu_misses``), and the CPU mode is to be fixed there.

The finding goes into the row's ``cpu_verdict_checked`` (``overlap-harness sglang
--gpu-check-cpu REPORT``, run on a CPU machine after the device run)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

#: the probe's ordering entries: ``"NAME at PATH:LINE"``
_AT = " at "
HARNESS_PREFIX = "overlap_harness/"
#: the GPU mode's own instruments (the access values' snapshots, the probe)
INSTRUMENT_PREFIX = "overlap_harness/engines/sglang/gpu/"
#: frames below a listed call: torch's own, or Triton's launcher and interpreter
LIBRARY_PREFIXES = ("torch/", "triton/")
#: the ordering calls proper: each is an op the CPU mode records where it runs
SYNC_CALLS = frozenset({"synchronize", "wait_stream", "wait_event", "wait", "query"})
#: calls that order only where they touch device memory (a copy, a host read of a value);
#: the CPU mode records every op on device memory, so nothing recorded at the line means
#: none was touched there (a host tensor, a conversion to the same dtype)
DATA_CALLS = frozenset({"item", "tolist", "cpu", "numpy", "_local_scalar_dense", "is_nonzero",
                        "nonzero", "to", "copy_"})


def ordering_calls(row: dict[str, Any]) -> dict[str, int]:
    """Each call the row's probed trials saw between the sides (``"to at a.py:3"``), with the
    largest count any one trial saw."""
    calls: dict[str, int] = {}
    for trial in row.get("trial_details", []):
        for call, times in ((trial.get("probe") or {}).get("orderings") or {}).items():
            calls[call] = max(times, calls.get(call, 0))
    return calls


def _location(call: str) -> str:
    return call.rpartition(_AT)[2]


def recorded_at(timeline: Sequence[Any]) -> dict[str, list[str]]:
    """``path:line`` (``sglang/...`` from the package on) -> what the recorder recorded
    there: ``"copy on forward_stream"``, ``"host_sync on host"``."""
    out: dict[str, list[str]] = {}
    for op in timeline:
        source = op.source.replace(os.sep, "/")
        marker = source.rfind("sglang/")
        if marker < 0 or not source:
            continue
        entry = f"{op.kind} on {op.agent}"
        seen = out.setdefault(source[marker:], [])
        if entry not in seen:
            seen.append(entry)
    return out


def classify(calls: dict[str, int], recorded: dict[str, list[str]]) -> dict[str, Any]:
    """Each ordering call's class (see the module docstring) and the row's finding."""
    entries = []
    for call, times in calls.items():
        name, where = call.partition(_AT)[0], _location(call)
        if where.startswith(INSTRUMENT_PREFIX):
            kind, what = "instrument", ("the GPU mode's own snapshot of a side's values (a "
                                        "non-blocking copy on the op's stream: no host wait)")
        elif where.startswith(HARNESS_PREFIX):
            kind, what = "stand_in", "the harness's stand-in code, not SGLang's"
        elif where.startswith(LIBRARY_PREFIXES):
            kind, what = "inside_library", "inside torch or Triton, below a listed call"
        elif where in recorded:
            kind, what = "recorded", "recorded as " + ", ".join(recorded[where])
        elif name == "record_stream":
            kind, what = "allocator", ("the CPU mode keeps record_stream in its allocator "
                                       "(the block's reuse waits for the stream); it orders "
                                       "no two ops")
        elif name in DATA_CALLS:
            kind, what = "no_device_op", ("no op on device memory at this line (the CPU mode "
                                          "records every one): a host value or a no-op "
                                          "conversion, no ordering")
        else:
            kind, what = "missed", "nothing recorded at this line by the CPU mode"
        entries.append({"call": call, "times": times, "class": kind, "what": what})
    missed = [e["call"] for e in entries if e["class"] == "missed"]
    stand_ins = [e["call"] for e in entries if e["class"] == "stand_in"]
    if not entries:
        finding = ("no call that can order the sides ran between them on the host: the "
                   "device ran the earlier side before the later side was reached (timing); "
                   "the CPU mode's race stands")
    elif missed:
        finding = ("the CPU mode records nothing at " + ", ".join(missed) + ": an ordering "
                   "it may miss (cpu_misses)")
    elif stand_ins:
        finding = ("the calls between the sides include the harness's stand-ins' own ("
                   + ", ".join(stand_ins) + "): where one waits for the device (a host read, "
                   "a blocking copy; a dtype conversion on the device does not), it orders "
                   "the device run alone, SGLang's code makes none (tools/gpu_host_syncs.py "
                   "measures which do); SGLang's calls between the sides are recorded by the "
                   f"CPU mode, or order nothing there ({_classes(entries)}): the CPU mode's "
                   "race stands")
    else:
        finding = ("every call between the sides is recorded by the CPU mode, or orders "
                   f"nothing there ({_classes(entries)}), and its happens-before does not "
                   "order the sides with them: the CPU mode's race stands (the device's "
                   "order is timing)")
    return {"cpu_misses": bool(missed), "finding": finding, "calls": entries}


def _classes(entries: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry["class"]] = counts.get(entry["class"], 0) + 1
    return ", ".join(f"{kind} {number}" for kind, number in counts.items())


def check_site(planned: tuple[str, str | None, list[dict[str, Any]]]
               ) -> list[dict[str, Any] | str]:
    """In a forked child: ``variant`` run in CPU mode with ``site`` removed, each of the
    rows' :func:`classify` (an error text for a run that could not be made)."""
    from overlap_harness.engines.core.engine_output import captured
    from overlap_harness.engines.core.mutation import Coverage, remove_site
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.gpu.table import find_site
    from overlap_harness.engines.sglang.variants import VARIANTS

    variant, site, rows = planned
    print(f"  {variant} without {site or 'no site'}: {len(rows)} rows", file=sys.stderr,
          flush=True)  # progress: a CPU run takes seconds to a minute
    try:
        environment.load(os.environ.get("OVERLAP_HARNESS_SGLANG_SRC") or None)
        if site is not None:
            remove_site(find_site(site), Coverage())
        with captured(f"{variant} run", summary=False):  # SGLang's own log lines held back
            run = run_variant(VARIANTS[variant])
    except Exception as exc:  # the row says so
        return [f"the CPU run could not be made: {type(exc).__name__}: {exc}"] * len(rows)
    recorded = recorded_at(run.watch.recording.timeline)
    return [classify(ordering_calls(row), recorded) for row in rows]


def timing_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's rows whose race the device could not make (``why_reason`` timing)."""
    return [row for row in report["rows"] if row.get("why_reason") == "timing"]


def check_report(report: dict[str, Any], jobs: int) -> int:
    """Every timing row of ``report`` given its ``cpu_verdict_checked`` (in place); the
    number of rows checked."""
    from overlap_harness.engines.core.necessity import forked_map

    by_run: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    for row in timing_rows(report):
        by_run.setdefault((row["variant"], row["site"]), []).append(row)
    planned = [(variant, site, rows) for (variant, site), rows in by_run.items()]
    for (_, _, rows), found in zip(planned, forked_map(check_site, planned, jobs), strict=True):
        for row, finding in zip(rows, found, strict=True):
            row["cpu_verdict_checked"] = finding if isinstance(finding, dict) else {
                "cpu_misses": None, "finding": finding, "calls": []}
    return sum(len(rows) for rows in by_run.values())
