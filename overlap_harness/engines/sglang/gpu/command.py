"""``overlap-harness sglang --gpu``: the loop report's rows checked on a CUDA device.

Each (variant, site) the loop report judged is run with the site removed and its race forced
(:mod:`.gpu.table`); the report goes to ``--gpu-report DIR`` (:mod:`.gpu.report`). Exit 0 when
every necessary row showed a wrong value and every redundant row and the unmodified loop stayed
equal to the serial answer, 1 otherwise, 2 without CUDA or on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

from overlap_harness.engines.core.command import fail, unknown_variants

PROG = "overlap-harness sglang --gpu"
DEFAULT_LOOP_REPORT = Path("reports/conformance/sglang-0.5.23-loop.json")


def run(args: argparse.Namespace) -> int:
    """Check CUDA, load the tree, run the table, write the report."""
    import torch

    if not torch.cuda.is_available():
        return fail(PROG, "needs a CUDA device; this torch sees none (the CPU mode is "
                    "`overlap-harness sglang` without --gpu)")
    if args.necessity or args.loop_report:
        return fail(PROG, "--gpu reads the necessity verdicts from --loop-json; it does not "
                    "take --necessity or --loop-report")
    loop_path = args.loop_json or DEFAULT_LOOP_REPORT
    if not loop_path.is_file():
        return fail(PROG, f"{loop_path}: no loop report (write one with --necessity "
                    "--loop-report DIR, or pass --loop-json FILE)")
    loop_document = json.loads(loop_path.read_text())
    names = args.variant or loop_document["variants"]
    if (message := unknown_variants(names, loop_document["variants"])) is not None:
        return fail(PROG, message)
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.gpu import report as gpu_report
    from overlap_harness.engines.sglang.gpu import table as gpu_table

    try:
        tree = environment.load(args.sglang_src)
    except environment.SglangTreeError as exc:
        return fail(PROG, str(exc))
    if tree.version != loop_document["sglang_version"]:
        return fail(PROG, f"sglang {tree.version} imported, the loop report is of "
                    f"{loop_document['sglang_version']}")
    if args.sglang_src:
        import os

        os.environ["OVERLAP_HARNESS_SGLANG_SRC"] = str(args.sglang_src)
    device = torch.cuda.get_device_name()
    print(f"sglang {tree.version} from {tree.package_dir} on {device}; "
          f"{len(names)} variants, {args.jobs} children at a time", flush=True)
    started = time.perf_counter()
    progress = args.gpu_report / "gpu-rows.jsonl" if args.gpu_report else None
    if progress is not None:
        args.gpu_report.mkdir(parents=True, exist_ok=True)
        progress.unlink(missing_ok=True)
    kept, earlier = _resumed(args.gpu_resume, tree.version, device)
    if isinstance(kept, str):
        return fail(PROG, kept)
    skip = frozenset((r["variant"], r["site"]) for r in kept)
    rows, failures = gpu_table.run_table(loop_document, names, args.jobs, args.gpu_timeout,
                                         args.gpu_deadline, progress, skip)
    command = "overlap-harness " + shlex.join(sys.argv[1:])
    report = gpu_report.document(
        kept + rows, version=tree.version, device=device, torch_version=torch.__version__,
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        command=f"{earlier['command']}; then {command}" if earlier else command,
        failures=[f for f in (earlier or {}).get("child_failures", [])
                  if not f.endswith("stopped at the deadline")] + failures,
        seconds=time.perf_counter() - started + (earlier or {}).get("seconds", 0.0))
    if earlier:
        before = earlier.get("runs") or [{"date": earlier["date"], "command": earlier["command"],
                                          "seconds": earlier["seconds"]}]
        now = {"date": report["date"], "command": command,
               "seconds": round(time.perf_counter() - started, 1)}
        report["runs"] = [*before, now]
    print(json.dumps(report["summary"]))
    if args.gpu_report:
        for path in gpu_report.write(report, args.gpu_report):
            print(f"wrote {path}")
    s = report["summary"]
    clean = not (s["race_rows_all_equal"] or s["race_free_rows_wrong"] or s["unmodified_wrong"]
                 or s["errors"])
    return 0 if clean else 1


def _resumed(path: Path | None, version: str, device: str
             ) -> tuple[list[dict] | str, dict | None]:
    """The rows with trials of an earlier report (``--gpu-resume``) and that report; an
    error text when it is of another tree or device."""
    if path is None:
        return [], None
    earlier = json.loads(path.read_text())
    if earlier["sglang_version"] != version or earlier["device"] != device:
        return (f"{path}: a report of sglang {earlier['sglang_version']} on "
                f"{earlier['device']}, not {version} on {device}"), None
    return [r for r in earlier["rows"] if r.get("trials")], earlier
