"""The necessity table as Markdown: one row per sync site, one column per variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MARK = {"necessary": "**necessary**", "redundant": "redundant", "not_reached": "-",
         "error": "error"}


def markdown(document: dict[str, Any]) -> str:
    """The command's JSON document (with ``necessity``) as a Markdown report."""
    variants: list[str] = document["variants"]
    lines = [f"# SGLang {document['sglang_version']}: sync sites of the overlap loop", "",
             f"Source: `{document['source']}`. Each site removed in turn (its function "
             "recompiled without it); per variant: **necessary** (races the intact code does "
             "not have), redundant (reached, nothing new raced), - (not reached).", "",
             "| site | code | " + " | ".join(variants) + " |",
             "|---|---|" + "---|" * len(variants)]
    by_site: dict[str, dict[str, Any]] = {}
    for row in document.get("necessity", []):
        by_site.setdefault(row["site"], {"code": row["code"]})[row["variant"]] = row
    gaps = []
    for site, cells in by_site.items():
        marks = [_MARK[cells[v]["verdict"]] if v in cells else "" for v in variants]
        if all(m == "-" for m in marks):
            gaps.append(site)
        code = cells["code"].replace("|", "\\|")[:70]
        lines.append(f"| {Path(site).name} | `{code}` | "
                     + " | ".join(marks) + " |")
    lines += ["", f"Coverage gaps (no variant reaches them): {len(gaps)} of {len(by_site)} "
              "sites.", ""]
    return "\n".join(lines)
