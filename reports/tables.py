"""Plain-text tables for a terminal: the results table in 120 columns, and the legends that
say what the what-if variants and the necessity table's signed columns mean.

The results table used to size every column to its longest cell, about 210 characters on the
bundled suite, so an 80- or 120-column terminal wrapped it and cut the races column. Here
each scenario is a heading line over its runs, and the races column takes what the fixed
columns leave of :data:`WIDTH`, wrapping onto continuation lines rather than cutting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from overlap_harness.model.results import CaseResult

WIDTH = 120
"""The widest line a table may print (characters)."""

HEAD = ["scenario", "mutation", "expect", "verdict", "races", "manifest", "stall us",
        "bubbles us", "ok"]

#: What each what-if variant changes, for the legend printed under the what-if table.
WHATIF_LEGEND: dict[str, str] = {
    "ref": "the scenario's own protocol, unchanged",
    "verify_done": "seq_lens synced by the legacy verify_done wait, no WAR barrier (before "
                   "#25879)",
    "publish_ready_no_barrier": "seq_lens relayed through publish_ready, no WAR barrier "
                                "(#25879 alone)",
    "d2h_on_schedule": "the host gets seq_lens by a blocking .cpu() on the schedule stream",
    "publish_after_draft_extend": "publish_ready recorded after draft-extend, not after "
                                  "verify",
    "read_done": "WAR barrier: the schedule stream waits a read_done event (#28363)",
    "after_launch": "WAR barrier right after each forward launch (#31687)",
    "no_barrier": "no WAR barrier at all",
    "loop_top": "WAR barrier: the schedule stream waits the forward stream at the loop top",
    "after_replay_prepare": "WAR barrier recorded after replay_prepare's metadata reads (the "
                            "worked example of a new placement: one class, one scenario)",
}

#: Protocol keys that only spec-v2 reads (non-spec relays output tokens only, so a variant
#: that sets one of these runs the reference again there).
SPEC_ONLY_KEYS = frozenset({"seq_lens_sync", "seq_lens_d2h", "publish_point"})

NECESSITY_LEGEND = (
    "stall saved us / idle saved us: the host stall and the forward stream's idle time of "
    "the base run minus those of the run without the sync, over the whole run. Positive: "
    "the sync costs that much. Negative: the run without it stalled or idled more (a "
    "removed wait can let another stream's work slip in front, or move a later blocking "
    "sync), so the sync saves time there. Zero: it costs nothing measurable."
)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``...`` when cut."""
    return text if len(text) <= width else text[:max(width - 3, 0)] + "..."


def pack(items: Sequence[str], width: int) -> list[str]:
    """``items`` joined by ``", "`` into lines of at most ``width``, never splitting an item
    (one longer than ``width`` is cut with ``...``)."""
    lines: list[str] = []
    for item in items:
        item = fit(item, width - 1)  # room for the comma that may follow
        if lines and len(lines[-1]) + 2 + len(item) + 1 <= width:
            lines[-1] += ", " + item
        else:
            if lines:
                lines[-1] += ","
            lines.append(item)
    return lines or ["-"]


def text_table(rows: Sequence[Sequence[str]], head: Sequence[str],
               limits: Mapping[int, int] | None = None) -> str:
    """Left-aligned columns two spaces apart; column ``i`` cut to ``limits[i]`` characters."""
    limits = limits or {}
    cells = [[fit(str(c), limits.get(i, 10**9)) for i, c in enumerate(row)]
             for row in [list(head), *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:.0f}"


def result_row(r: CaseResult) -> list[str]:
    """One case's cells, in :data:`HEAD` order."""
    m = r.metrics
    return [r.scenario, r.mutation or "base", r.expect, r.verdict,
            ", ".join(r.race_keys()) or "-", "yes" if r.manifest else "no",
            _us(None if m is None else m.host_stall_ns),
            _us(None if m is None else m.forward_idle_ns), "ok" if r.ok else "FAIL"]


ROW_HEAD = ["  mutation", "expect", "verdict", "races", "manifest", "stall us", "bubbles us",
            "ok"]
MIN_RACES = 33
"""The races column is never narrower than this (the suite's longest key, ``host-D2H
new_seq_lens_cpu_pinned``, and its comma); its text wraps onto more lines instead."""


def results_table(results: Iterable[CaseResult], width: int = WIDTH) -> str:
    """The results table, grouped by scenario, no line wider than ``width``.

    Each scenario is a heading line; its runs follow, one row each. The races column takes
    what the other columns leave (at least :data:`MIN_RACES`) and wraps its ``KIND buffer``
    keys onto continuation lines, so nothing is cut; a mutation name longer than its column
    is cut with ``...`` (the full name is in the race reports and ``summary.html``).
    """
    groups: dict[str, list[list[str]]] = {}
    for r in results:
        row = result_row(r)
        groups.setdefault(row[0], []).append(["  " + row[1], *row[2:]])
    rows = [row for group in groups.values() for row in group]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(ROW_HEAD)]
    gaps = len(ROW_HEAD) - 1  # one space between columns: the headers keep them apart
    others = sum(widths) - widths[0] - widths[3] + gaps
    widths[0] = max(len(ROW_HEAD[0]), min(widths[0], width - others - MIN_RACES))
    widths[3] = max(MIN_RACES, width - others - widths[0])

    def line(cells: Sequence[str]) -> str:
        return " ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(ROW_HEAD), line(["-" * w for w in widths])]
    for scenario, group in groups.items():
        out.append(fit(scenario, width))
        for row in group:
            races = pack(row[3].split(", "), widths[3])
            out.append(line([fit(row[0], widths[0]), *row[1:3], races[0], *row[4:]]))
            out += [line(["", "", "", more, "", "", "", ""]) for more in races[1:]]
    return "\n".join(out)


def necessity_table(rows: Sequence[Sequence[str]]) -> str:
    """The sync necessity table with its legend (what a negative saving means)."""
    head = ["scenario", "sync", "verdict", "races when removed", "manifest",
            "stall saved us", "idle saved us"]
    return text_table(rows, head, {3: 40}) + "\n" + NECESSITY_LEGEND


def variants_for_mode(variants: Mapping[str, Mapping[str, Any]], mode: str,
                      protocol: Mapping[str, Any] | None = None) -> dict[str, Mapping[str, Any]]:
    """The what-if variants that change something in ``mode``.

    Drops, except ``ref``, a variant that sets a spec-only key in ``non_spec`` mode, and
    (given the scenario's ``protocol`` keys) one whose every override is already the
    scenario's value: both would run the reference again under another name.
    """
    out: dict[str, Mapping[str, Any]] = {}
    for name, overrides in variants.items():
        if name != "ref":
            if str(mode) == "non_spec" and SPEC_ONLY_KEYS & set(overrides):
                continue
            if protocol is not None and all(str(protocol.get(k)) == str(v)
                                            for k, v in overrides.items()):
                continue
        out[name] = overrides
    return out


def whatif_legend(names: Iterable[str]) -> str:
    """One line per variant shown: its name and what it changes."""
    names = list(names)
    pad = max((len(n) for n in names), default=0)
    return "\n".join(f"  {n.ljust(pad)}  {WHATIF_LEGEND.get(n, 'custom overrides')}"
                     for n in names)
