"""Write reports/conformance/tokenspeed-<version>.{json,md}: TokenSpeed's own overlap loop run
under the recorder (every variant as released), the necessity table of its sync sites over
all variants, and beside each reached row the protocol model's verdict for the same removal
(overlap_harness/engines/tokenspeed/model_column.py).

Run in a venv with TokenSpeed (docs/tokenspeed.md):
    python tools/tokenspeed_report.py --tokenspeed-src TREE --out reports/conformance -j 2
`overlap-harness tokenspeed --necessity` runs the same table; this adds the model column.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from overlap_harness.engines.core.committed import (
    cpu_seconds_with_children,
    distinct_races,
    machine_free,
    write_report,
)
from overlap_harness.engines.tokenspeed import environment, necessity
from overlap_harness.engines.tokenspeed.model_column import model_row, summary

VERDICTS = ("necessary", "redundant", "not_reached", "error")


#: where a path's package-relative part starts: the harness's own files (checked first: its
#: engines/tokenspeed/ folder), TokenSpeed's tree
MARKERS = (("/overlap_harness/", "overlap_harness/"), ("/tokenspeed/", "tokenspeed/"))


def build(source: str | None, jobs: int) -> dict[str, Any]:
    """The whole report as one JSON-ready document."""
    info = environment.load(source)
    names = list(necessity.variant_runs())
    began, began_all = time.process_time(), cpu_seconds_with_children()
    baseline = {name: necessity.run_outcome(name) for name in names}
    table = [row.to_json() for row in necessity.table(names, baseline, jobs)]
    reached = [{**distinct_races(row), **model_row(row)} for row in table
               if row["verdict"] != "not_reached"]
    return {
        "tokenspeed_version": info.version,
        "variants": {name: {"races": len(o.races), "ops": o.ops}
                     for name, o in baseline.items()},
        "sites": len({row["site"] for row in table}),
        "counts": {verdict: sum(row["verdict"] == verdict for row in table)
                   for verdict in VERDICTS},
        "model": summary(reached),
        "rows": machine_free(reached, MARKERS),
        "cpu_seconds": round(time.process_time() - began, 1),
        "cpu_seconds_with_children": round(cpu_seconds_with_children() - began_all, 1)}


def _first_pair(row: dict[str, Any]) -> str:
    if not row["races"]:
        return ""
    race = row["races"][0]
    ends = [f"{Path(race[side]['file']).name}:{race[side]['line']}"
            for side in ("first", "second")]
    return f"{race['kind']} {ends[0]} -> {ends[1]}"


def markdown(report: dict[str, Any]) -> str:
    """The report as a page: variants, the necessity table with the model column."""
    counts, model = report["counts"], report["model"]
    page = [f"# TokenSpeed {report['tokenspeed_version']}: its overlap loop under the recorder",
            "", "Made by `tools/tokenspeed_report.py` (docs/tokenspeed.md). CPU mode, CUDA "
            "faked; what stands in for TokenSpeed's kernels, forward and front end is listed "
            "there.", "", "| variant | races as released | recorded ops |", "|---|---|---|",
            *(f"| {name} | {v['races']} | {v['ops']} |"
              for name, v in report["variants"].items()),
            "", "## Necessity of each sync site, beside the model", "",
            f"{report['sites']} removable sync sites x {len(report['variants'])} variants "
            "(the scan's non-blocking copies are listed by `--necessity`, not removed: "
            "removing a copy moves no data rather than dropping an ordering): "
            f"{counts['necessary']} necessary, {counts['redundant']} redundant, "
            f"{counts['error']} errors, {counts['not_reached']} not reached (left out below). "
            f"Model column (model/protocol/one_forward_thread.py, scenarios "
            f"overlap_harness/conformance/model_scenarios/tokenspeed_loop_*.toml): "
            f"{model['modelled']} of {model['reached']} reached rows modelled, "
            f"{model['disagreements']} disagreements, {model['not_modelled']} not modelled "
            "(the reason in the row).", "",
            "| variant | site | code | real | races | e.g. first -> second | model | why |",
            "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        code = row["code"].replace("|", "\\|")[:70]
        page.append(f"| {row['variant']} | {row['site']} | `{code}` | {row['real']} | "
                    f"{row['race_count']} | {_first_pair(row)} | {row['model']} | "
                    f"{row['explanation']} |")
    page += ["", f"CPU time of the runs (imports excluded): {report['cpu_seconds']} s in this "
             f"process, {report['cpu_seconds_with_children']} s with the table's forked "
             "children.", ""]
    return "\n".join(page)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenspeed-src", default=None)
    parser.add_argument("--out", type=Path, default=Path("reports/conformance"))
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        report = build(args.tokenspeed_src, args.jobs)
    except environment.TokenSpeedUnavailable as exc:
        print(f"tokenspeed_report: {exc}", file=sys.stderr)
        return 2
    stem = write_report(report, markdown(report), args.out,
                        f"tokenspeed-{report['tokenspeed_version']}")
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
