"""Every verdict with the configuration it holds under: per sync site, the variants in which
removing it races (necessary), does not (redundant) or which never run it, and for a site no
variant runs, the reason read from SGLang's source (:mod:`.report.unreached`).

Shared by the necessity page (``--necessity``'s Markdown, :mod:`.report.necessity_table`) and the
loop report (:mod:`.report.loop_report`); the variants' configurations are
:data:`.variants.VARIANTS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from overlap_harness.engines.sglang.report import unreached

#: the necessity table's verdict words and the loop report's, as one
_WORDS = {"necessary": "necessary", "race": "necessary", "redundant": "redundant",
          "race_free": "redundant", "not_reached": "unreached", "error": "error"}


def per_site(rows: Iterable[dict[str, Any]], site_of: Any = None) -> list[dict[str, Any]]:
    """``[{site, code, necessary_in, redundant_in, unreached_in, error_in}]`` in first-seen
    site order, from necessity rows (``verdict``) or loop-report rows (``real``);
    ``site_of(row)`` names the site (default: the row's ``site``)."""
    by_site: dict[str, dict[str, Any]] = {}
    for row in rows:
        site = site_of(row) if site_of else row["site"]
        entry = by_site.setdefault(site, {"site": site, "code": row["code"],
                                          "necessary_in": [], "redundant_in": [],
                                          "unreached_in": [], "error_in": []})
        word = _WORDS[row.get("real", row.get("verdict"))]
        entry[f"{word}_in"].append(row["variant"])
    return list(by_site.values())


def unreached_sites(summary: list[dict[str, Any]], package: Path) -> list[dict[str, Any]]:
    """``[{site, reason, category, condition, function, guards}]`` for each site of
    ``summary`` (:func:`per_site`) that no variant reaches; ``package`` is the sglang
    package the table ran (holding ``srt/``)."""
    out = []
    for entry in summary:
        if entry["necessary_in"] or entry["redundant_in"] or entry["error_in"]:
            continue
        found = unreached.reason(package, _short(entry["site"]), entry["code"])
        out.append({"site": _short(entry["site"]), "reason": found["reason"],
                    "category": found["category"], "condition": found["condition"],
                    "function": found["function"], "guards": found["guards"]})
    return out


def _short(site: str) -> str:
    """``sglang/srt/...`` of a site, absolute or already relative to the tree root."""
    marker = "/sglang/srt/"
    rooted = site if site.startswith("/") else "/" + site
    return "sglang/srt/" + rooted.split(marker, 1)[1] if marker in rooted else site


def markdown(summary: list[dict[str, Any]], unreached_list: list[dict[str, Any]]
             ) -> list[str]:
    """The page's two sections: per site the configurations of each verdict, then the
    sites no variant reaches with their reasons."""
    lines = ["## Per site: in which configurations", "",
             "A verdict holds for the variants named (their configurations: "
             "overlap_harness/engines/sglang/variants.py, docs/sglang-loop.md).", "",
             "| site | necessary in | redundant in | not reached in |", "|---|---|---|---|"]
    for entry in summary:
        cells = [", ".join(entry[key]) or "-" for key in
                 ("necessary_in", "redundant_in", "unreached_in")]
        lines.append(f"| {_short(entry['site'])} | " + " | ".join(cells) + " |")
    lines += ["", f"## Sites no variant reaches ({len(unreached_list)})", "",
              "Each reason is read from SGLang's source (overlap_harness/engines/sglang/"
              "report/unreached.py): a platform guard found by AST, no call site in the package, "
              "or a documented SGLang condition checked against the guards on the path.", "",
              "| site | category | condition | reason |", "|---|---|---|---|"]
    for entry in unreached_list:
        condition = str(entry["condition"]).replace("|", "\\|")
        lines.append(f"| {entry['site']} | {entry['category']} | `{condition}` | "
                     f"{entry['reason']} |")
    return [*lines, ""]
