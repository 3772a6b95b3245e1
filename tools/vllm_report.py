"""Write reports/conformance/vllm-<version>.{json,md}: vLLM's own async-scheduling code run
under the recorder (every driven variant as released), the necessity table of its syncs, and
its published races at their pre-fix releases.

Run in a venv with vLLM (docs/vllm.md):  python tools/vllm_report.py --out reports/conformance
`overlap-harness vllm --necessity` runs the same table; this adds the historical races.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from overlap_harness.engines.core.committed import (
    cpu_seconds_with_children,
    distinct_races,
    machine_free,
    write_report,
)
from overlap_harness.engines.vllm import historical, necessity
from overlap_harness.engines.vllm.environment import VllmUnavailable, load
from overlap_harness.engines.vllm.release_features import not_applicable_reason

#: a site relative to site-packages (vLLM) or to the repository (the drivers); a tree given
#: with --vllm-src is added first (its root, so its vllm/... paths stay)
MARKERS = (("/site-packages/", ""), ("/overlap_harness/", "overlap_harness/"))


def build(jobs: int = 1, source: str | None = None) -> dict:
    """The whole report as one JSON-ready document (``source``: a tree holding the ``vllm``
    package, as ``overlap-harness vllm --vllm-src`` takes it; None: the installed vLLM)."""
    info = load(source)
    markers = MARKERS if source is None else (
        (str(Path(info.location).parent) + "/", ""), *MARKERS)
    not_applicable = {name: reason for name in necessity.variant_runs()
                      if (reason := not_applicable_reason(name)) is not None}
    names = [name for name in necessity.variant_runs() if name not in not_applicable]
    start, start_all = time.process_time(), cpu_seconds_with_children()
    baseline = {name: necessity.run_outcome(name) for name in names}
    released = {name: {"races": len(o.races), "ops": o.ops} for name, o in baseline.items()}
    rows = [distinct_races(row.to_json()) for row in necessity.table(names, baseline, jobs)]
    reached = [row for row in rows if row["verdict"] != "not_reached"]
    with tempfile.TemporaryDirectory() as folder:
        history = [historical.historical_entry(race, Path(folder))
                   for race in historical.HISTORICAL]
    counts = {verdict: sum(row["verdict"] == verdict for row in rows)
              for verdict in ("necessary", "redundant", "not_reached", "error")}
    return {"vllm_version": info.version,
            "source": "site-packages/vllm" if source is None else "the vllm wheel's tree",
            "variants": released,
            "not_applicable": [{"variant": n, "reason": r} for n, r in not_applicable.items()],
            "sites": len({row["site"] for row in rows}),
            "counts": counts, "rows": machine_free(reached, markers), "historical": history,
            "cpu_seconds": round(time.process_time() - start, 1),
            "cpu_seconds_with_children": round(cpu_seconds_with_children() - start_all, 1)}


def _pair(race: dict) -> str:
    first, second = race["first"], race["second"]
    return (f"{race['kind']} {Path(first['file']).name}:{first['line']} -> "
            f"{Path(second['file']).name}:{second['line']}")


def markdown(report: dict) -> str:
    """The report as a page: variants, the necessity table, the historical races."""
    out = [f"# vLLM {report['vllm_version']}: async scheduling under the recorder", "",
           "Made by `tools/vllm_report.py` (docs/vllm.md). CPU mode; only the model faked.", "",
           "| variant | races as released | recorded ops |", "|---|---|---|"]
    out += [f"| {name} | {v['races']} | {v['ops']} |" for name, v in report["variants"].items()]
    out += [f"| {n['variant']} | not applicable: {n['reason']} | - |"
            for n in report.get("not_applicable", [])]
    counts = report["counts"]
    out += ["", "## Necessity of each sync (removed from vLLM's own function)", "",
            f"{report['sites']} removable sites x {len(report['variants'])} variants: "
            f"{counts['necessary']} necessary, {counts['redundant']} redundant, "
            f"{counts['error']} errors, {counts['not_reached']} not reached (left out below).",
            "", "| variant | site | code | verdict | races | e.g. first -> second |",
            "|---|---|---|---|---|---|"]
    for row in report["rows"]:
        pairs = "; ".join(sorted({_pair(r) for r in row["races"]})[:2])
        out.append(f"| {row['variant']} | {row['site']} | `{row['code']}` | "
                   f"{row['verdict']} | {row['race_count']} | {pairs} |")
    out += ["", "## Published races at their pre-fix releases", "",
            "| ref | pattern | pre-fix | races | lines | post-fix | races |",
            "|---|---|---|---|---|---|---|"]
    for entry in report["historical"]:
        if "not_applicable" in entry:
            out.append(f"| {entry['ref']} | {entry['pattern']} | not applicable to this tree: "
                       f"{entry['not_applicable']} | - | - | - | - |")
            continue
        pre, post = entry["pre_fix"], entry["post_fix"]
        lines = "; ".join(f"{p['kind']} {p['first']} -> {p['second']}" for p in pre["lines"])
        out.append(f"| {entry['ref']} | {entry['pattern']} | {pre['source']} | {pre['races']} "
                   f"| {lines} | {post['source']} | {post['races']} |")
    out += ["", "What ran as whose code (`released_code`: the release's own functions run; "
            "`harness_code`: what the harness stands in for; docs/vllm.md):", "",
            "| ref | released_code | read_code | installed_code | harness_code | "
            "difference from |", "|---|---|---|---|---|---|"]
    for entry in report["historical"]:
        cells = ["<br>".join(entry.get(key, [])) or "-" for key in (
            "released_code", "read_code", "installed_code", "harness_code")]
        out.append(f"| {entry['ref']} | " + " | ".join(cells)
                   + f" | {entry.get('difference', '-')} |")
    out += ["", f"CPU time of the runs (imports excluded): {report['cpu_seconds']} s in this "
            f"process, {report['cpu_seconds_with_children']} s with the forked children of "
            "the table (issue 28's bar: the table under 300 s CPU on 2 cores).", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/conformance"))
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--vllm-src", metavar="PATH", default=None,
                        help="a tree holding the vllm package (an unzipped vllm wheel); "
                        "default: the installed vllm")
    args = parser.parse_args(argv)
    try:
        report = build(args.jobs, args.vllm_src)
    except VllmUnavailable as exc:
        print(f"vllm_report: {exc}", file=sys.stderr)
        return 2
    stem = write_report(report, markdown(report), args.out, f"vllm-{report['vllm_version']}")
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
