"""What an engine command prints and writes: one race in one line, the necessity table's
summary, and the table as Markdown (one row per site, one column per variant). Engine-neutral:
the adapter passes its engine's name and source."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.results import NecessityRow

_MARK = {"necessary": "**necessary**", "redundant": "redundant", "not_reached": "-",
         "error": "error"}


def describe(race: dict[str, Any]) -> str:
    """One race record (:func:`~.results.race_record`) on one line: kind, tensor, both
    sides with their op, stream and ``file:line``."""
    first, second = race["first"], race["second"]
    return (f"{race['kind']} {race['tensor']} (iteration {race['iteration']}): "
            f"{first['op']} on {first['stream']} at {first['file']}:{first['line']} / "
            f"{second['op']} on {second['stream']} at {second['file']}:{second['line']}")


def summary_lines(rows: Sequence[NecessityRow]) -> list[str]:
    """Each reached row's verdict (with one race or the error), then the coverage gaps:
    sites no variant reaches."""
    out = []
    for row in rows:
        if row.verdict == "not_reached":
            continue
        line = f"  {Path(row.site).name} {row.variant}: {row.verdict}"
        if row.races:
            line += f" ({len(row.races)} races, e.g. {describe(row.races[0])})"
        if row.error:
            line += f" ({row.error})"
        out.append(line)
    reached = {row.site for row in rows if row.verdict != "not_reached"}
    gaps = sorted({row.site for row in rows} - reached)
    out.append(f"coverage gaps: {len(gaps)} of {len(gaps) + len(reached)} removable sites "
               f"reached by no variant{': ' if gaps else ''}"
               + ", ".join(Path(g).name for g in gaps))
    return out


def necessity_markdown(title: str, source: str, variants: Sequence[str],
                       rows: Sequence[dict[str, Any]]) -> str:
    """The necessity table (rows as JSON, :meth:`NecessityRow.to_json`) as a Markdown page."""
    lines = [f"# {title}", "",
             f"Source: `{source}`. Each site removed in turn (its function recompiled without "
             "it); per variant: **necessary** (races the intact code does not have), "
             "redundant (reached, nothing new raced), - (not reached).", "",
             "| site | code | " + " | ".join(variants) + " |",
             "|---|---|" + "---|" * len(variants)]
    by_site: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_site.setdefault(row["site"], {"code": row["code"]})[row["variant"]] = row
    gaps = 0
    for site, cells in by_site.items():
        marks = [_MARK[cells[v]["verdict"]] if v in cells else "" for v in variants]
        gaps += all(m == "-" for m in marks)
        code = cells["code"].replace("|", "\\|")[:70]
        lines.append(f"| {Path(site).name} | `{code}` | " + " | ".join(marks) + " |")
    lines += ["", f"Coverage gaps (no variant reaches them): {gaps} of {len(by_site)} sites.",
              ""]
    return "\n".join(lines)
