"""The recorder corpus on a real GPU: forced manifestation, recorder GPU vs CPU verdicts, CSAN.

For every pair of tests/recorder_corpus/corpus.toml, on a CUDA machine::

    python3 tools/recorder_gpu_report.py --trials 10

1. values: each program runs ``--trials`` times with its forced delays (``CORPUS_DELAYS=1``)
   and as many times without; a racy twin should print a wrong value in every delayed trial,
   a fixed twin never;
2. the recorder, ``recorder.watch(mode="gpu")`` on real streams and ``mode="cpu"`` with CUDA
   faked: their verdicts (kind, tensor, both lines) should be equal and meet the manifest;
3. PyTorch's CUDA sanitizer (CSAN, ``TORCH_CUDA_SANITIZER=1``): whether it raised.

Each part runs in a worker process of its own (this file with ``--worker``), every program
in-process there (tests/recorder_corpus/runner.py), so torch and CUDA start four times, not
once per run. The values worker runs alone, first (timing matters there); the other three run
side by side. Between runs the worker synchronizes and empties the caching allocator's cache,
so a program's allocations start from the same pool state. Writes
``reports/recorder/<date>-<device>.json`` and ``.md``. Exit status: 0 when every expectation
held, 1 when one did not, 2 without CUDA or on a bad manifest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: make the repository importable
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from overlap_harness.gpu_check.semantics_check import driver_version  # noqa: E402
from overlap_harness.replay.report import device_slug  # noqa: E402
from tests.recorder_corpus.manifest import ManifestError, Pair, load_manifest  # noqa: E402
from tests.recorder_corpus.runner import run_program  # noqa: E402
from tests.recorder_corpus.verdicts import from_json, unmatched, watch_program  # noqa: E402

WORKERS = ("values", "csan", "recorder-gpu", "recorder-cpu")
WORKER_TIMEOUT_S = 170  # each worker; the whole script stays under 4 minutes on an H100


def _progress(message: str) -> None:
    """One progress line on stderr, flushed (the driver's terminal shows it at once)."""
    print(message, file=sys.stderr, flush=True)


def _programs(pairs: list[Pair]) -> list[tuple[str, Path]]:
    """``(row name, path)`` of every program, racy twin first."""
    return [(f"{p.name}_{twin}", path) for p in pairs
            for twin, path in (("racy", p.racy_path), ("fixed", p.fixed_path))]


def _settle() -> None:
    """Wait for every stream and drop cached blocks, so runs start from one allocator state."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    # Pinned blocks too: a reused one holds the last run's (right) values, so an early host
    # read would not show (seen on an H100: nonblocking_to_cpu wrong only in its first run);
    # fresh pinned pages read as zeros. torch 2.13 has torch.accelerator.empty_host_cache,
    # torch 2.11 only torch._C._host_emptyCache.
    empty_host_cache = (getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
                        or getattr(torch._C, "_host_emptyCache", None))
    if empty_host_cache is not None:
        empty_host_cache()


def _first_difference(value: Any, expected: Any) -> str:
    """Where a wrong value first differs, e.g. ``[0]: 0.0 != 2.0 (4096 of 4096 differ)``."""
    if not (isinstance(value, list) and isinstance(expected, list)):
        return f"{value!r} != {expected!r}"[:120]
    wrong = [i for i, (a, b) in enumerate(zip(value, expected, strict=False)) if a != b]
    if len(value) != len(expected) or not wrong:
        return f"length {len(value)} != {len(expected)}"
    first = wrong[0]
    return (f"[{first}]: {value[first]!r} != {expected[first]!r} "
            f"({len(wrong)} of {len(value)} differ)")


def worker_values(pairs: list[Pair], trials: int) -> dict[str, Any]:
    """Each program ``trials`` times with forced delays and ``trials`` times without."""
    rows = {}
    for name, path in _programs(pairs):
        start = time.perf_counter()
        _settle()
        run_program(path)  # warm-up: lazy kernel loading, allocator segments
        counts = {"delayed_wrong": 0, "plain_wrong": 0, "incomplete": 0}
        errors: set[str] = set()
        sample = ""
        for delays, key in ((True, "delayed_wrong"), (False, "plain_wrong")):
            for _ in range(trials):
                _settle()
                run = run_program(path, delays=delays)
                if not run.completed:
                    counts["incomplete"] += 1
                    errors.add(f"{run.error_type}: {run.error}")
                elif run.wrong:
                    counts[key] += 1
                    sample = sample or _first_difference(run.value, run.expected)
        rows[name] = {**counts, "errors": sorted(errors), "sample": sample}
        _progress(f"[values] {name}: wrong with delays {counts['delayed_wrong']}/{trials}, "
                  f"without {counts['plain_wrong']}/{trials} ({time.perf_counter() - start:.2f} s)")
    return rows


def worker_csan(pairs: list[Pair]) -> dict[str, Any]:
    """Each program once under CSAN (enabled by the environment before torch was imported)."""
    rows = {}
    for name, path in _programs(pairs):
        _settle()
        run = run_program(path)
        flagged = run.error_type == "CUDASanitizerErrors"
        failure = run.error if run.error_type and not flagged else ""
        rows[name] = {"flagged": flagged, "error": run.error if flagged else "",
                      "failure": failure}
        _progress(f"[csan] {name}: {'race' if flagged else 'no race'}"
                  f"{' (failed: ' + failure + ')' if failure else ''}")
    return rows


def worker_recorder(pairs: list[Pair], mode: str) -> dict[str, Any]:
    """Each program once under ``recorder.watch(mode=mode)``: its races as the report keeps
    them, and whether it completed with the value its author meant."""
    rows = {}
    for name, path in _programs(pairs):
        if mode == "gpu":
            _settle()
        try:
            run, races = watch_program(path, mode)
        except Exception as exc:  # a recorder failure is a row of the report, not the end
            rows[name] = {"verdict": "error", "error": f"{type(exc).__name__}: {exc}"[:300],
                          "races": []}
            _progress(f"[recorder-{mode}] {name}: error {rows[name]['error']}")
            continue
        rows[name] = {"verdict": "race" if races else "race_free", "races":
                      [r.as_dict() for r in races], "completed": run.completed,
                      "value_ok": run.completed and not run.wrong,
                      "error": f"{run.error_type}: {run.error}" if run.error_type else ""}
        _progress(f"[recorder-{mode}] {name}: {rows[name]['verdict']} ({len(races)})")
    return rows


def run_worker(kind: str, pairs: list[Pair], trials: int) -> dict[str, Any]:
    """The ``--worker`` entry: one part of the report, as JSON-ready rows by program."""
    if kind == "values":
        return worker_values(pairs, trials)
    if kind == "csan":
        return worker_csan(pairs)
    if importlib.util.find_spec("recorder") is None:
        return {"unavailable": "the recorder package is not importable here"}
    return worker_recorder(pairs, kind.removeprefix("recorder-"))


def _spawn(kind: str, args: argparse.Namespace, out: Path) -> subprocess.Popen:
    """Start one worker process writing its rows to ``out``."""
    env = dict(os.environ)
    env.pop("CORPUS_DELAYS", None)
    if kind == "csan":
        env["TORCH_CUDA_SANITIZER"] = "1"
    else:
        env.pop("TORCH_CUDA_SANITIZER", None)
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind,
               "--worker-out", str(out), "--trials", str(args.trials)]
    command += [f"--only={name}" for name in args.only]
    return subprocess.Popen(command, cwd=ROOT, env=env)


def _collect(kind: str, proc: subprocess.Popen, out: Path, deadline: float) -> dict[str, Any]:
    """A worker's rows, or ``{"unavailable": why}`` when it failed or ran out of time."""
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"unavailable": f"the {kind} worker ran past {WORKER_TIMEOUT_S} s"}
    if code != 0 or not out.is_file():
        return {"unavailable": f"the {kind} worker exited with status {code}"}
    return json.loads(out.read_text(encoding="utf-8"))


def gather(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Run the workers (values alone first, then the other three side by side)."""
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {kind: Path(tmp) / f"{kind}.json" for kind in WORKERS}
        for batch in (WORKERS[:1], WORKERS[1:]):
            procs = {kind: _spawn(kind, args, outs[kind]) for kind in batch}
            deadline = time.monotonic() + WORKER_TIMEOUT_S
            for kind, proc in procs.items():
                results[kind] = _collect(kind, proc, outs[kind], deadline)
    return results


def _expand(summary: list[int]) -> list[int]:
    """The elements of a ``[first, last, count]`` summary when they are contiguous (else the
    two ends only, which no element range of the manifest matches)."""
    if not summary:
        return []
    first, last, count = summary
    return list(range(first, last + 1)) if count == last - first + 1 else [first, last]


def recorder_side(pair: Pair, racy: bool, rows: dict[str, Any], name: str) -> dict[str, Any]:
    """One recorder mode's verdict on one program, with whether it meets the manifest."""
    if "unavailable" in rows:
        return {"verdict": "unavailable", "races": [], "meets_manifest": None,
                "error": rows["unavailable"]}
    row = dict(rows[name])
    seen = [from_json({**r, "elements": _expand(r["elements"])}) for r in row["races"]]
    if row["verdict"] == "error":
        row["meets_manifest"] = False
    elif racy:
        row["problems"] = unmatched(pair.races, seen, pair.racy_path)
        row["meets_manifest"] = not row["problems"]
    else:
        row["meets_manifest"] = not seen
    # The verdict: the distinct (kind, tensor, lines); a race reported twice for one pair of
    # lines (say by two host ops on one line) is one verdict.
    row["keys"] = [list(key) for key in sorted({s.key() for s in seen})]
    return row


def build_rows(pairs: list[Pair], results: dict[str, dict[str, Any]], trials: int) -> list[dict]:
    """One row per program from the four workers' results."""
    rows = []
    for pair in pairs:
        for racy, path in ((True, pair.racy_path), (False, pair.fixed_path)):
            name = f"{pair.name}_{'racy' if racy else 'fixed'}"
            values = results["values"].get(name)
            cpu = recorder_side(pair, racy, results["recorder-cpu"], name)
            gpu = recorder_side(pair, racy, results["recorder-gpu"], name)
            csan = results["csan"].get(name)
            manifests = None
            if values is not None and not values["incomplete"]:
                manifests = (values["delayed_wrong"] == trials if racy
                             else values["delayed_wrong"] == values["plain_wrong"] == 0)
            agree = None
            if "keys" in cpu and "keys" in gpu:
                agree = cpu["keys"] == gpu["keys"]
            rows.append({
                "pair": pair.name, "twin": "racy" if racy else "fixed",
                "file": str(path.relative_to(ROOT)),
                "predicted": [{"kind": r.kind, "tensor": r.tensor, "sites": list(r.sites)}
                              for r in pair.races] if racy else [],
                "values": values, "forced_manifestation_ok": manifests,
                "recorder_cpu": cpu, "recorder_gpu": gpu, "cpu_gpu_agree": agree,
                "csan": csan,
            })
    return rows


def sums(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The report's totals, each a count of rows (tests/recorder/test_gpu_report.py
    recomputes them from the rows)."""
    racy = [r for r in rows if r["twin"] == "racy"]
    fixed = [r for r in rows if r["twin"] == "fixed"]

    def count(group: list[dict[str, Any]], test: Any) -> int:
        return sum(1 for r in group if test(r))

    return {
        "pairs": len(racy),
        "racy_wrong_in_every_delayed_trial": count(racy, lambda r: r["forced_manifestation_ok"]),
        "fixed_never_wrong": count(fixed, lambda r: r["forced_manifestation_ok"]),
        "recorder_cpu_right": count(rows, lambda r: r["recorder_cpu"]["meets_manifest"]),
        "recorder_gpu_right": count(rows, lambda r: r["recorder_gpu"]["meets_manifest"]),
        "cpu_gpu_agree": count(rows, lambda r: r["cpu_gpu_agree"]),
        "csan_racy_flagged": count(racy, lambda r: (r["csan"] or {}).get("flagged")),
        "csan_fixed_flagged": count(fixed, lambda r: (r["csan"] or {}).get("flagged")),
    }


def _mark(flag: bool | None) -> str:
    """A table cell for a yes/no/unknown."""
    return {True: "yes", False: "**no**", None: "n/a"}[flag]


def render_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: where and how it ran, the totals, one row per program."""
    total = report["sums"]
    n = total["pairs"]
    lines = [
        f"# Recorder corpus on a GPU: {report['device']}", "",
        f"- date: {report['date']}; torch {report['torch']} (CUDA {report['cuda']}); "
        f"driver {report['driver']}; {report['wall_s']:.0f} s wall, {report['cpu_s']:.0f} s CPU",
        f"- command: `{report['command']}` at commit {report.get('commit', 'unknown')}",
        f"- forced delays: racy twins wrong in every one of {report['trials']} delayed trials: "
        f"{total['racy_wrong_in_every_delayed_trial']}/{n}; fixed twins never wrong: "
        f"{total['fixed_never_wrong']}/{n}",
        f"- recorder verdicts meeting the manifest: CPU mode {total['recorder_cpu_right']}/"
        f"{2 * n}, GPU mode {total['recorder_gpu_right']}/{2 * n}; CPU and GPU equal: "
        f"{total['cpu_gpu_agree']}/{2 * n}",
        f"- CSAN: flagged {total['csan_racy_flagged']}/{n} racy twins and "
        f"{total['csan_fixed_flagged']}/{n} fixed twins", "",
        "| program | predicted | wrong with delays | without | recorder CPU | recorder GPU "
        "| CPU = GPU | CSAN |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["programs"]:
        values = row["values"] or {}
        predicted = ", ".join(f"{p['kind']} {p['tensor']}" for p in row["predicted"]) or "none"
        csan = row["csan"] or {}
        csan_cell = "race" if csan.get("flagged") else ("failed" if csan.get("failure") else
                                                        "no race" if csan else "n/a")
        lines.append(
            f"| {row['pair']} ({row['twin']}) | {predicted} | "
            f"{values.get('delayed_wrong', 'n/a')}/{report['trials']} | "
            f"{values.get('plain_wrong', 'n/a')}/{report['trials']} | "
            f"{row['recorder_cpu']['verdict']} ({_mark(row['recorder_cpu']['meets_manifest'])}) | "
            f"{row['recorder_gpu']['verdict']} ({_mark(row['recorder_gpu']['meets_manifest'])}) | "
            f"{_mark(row['cpu_gpu_agree'])} | {csan_cell} |")
    notes = _notes(report)
    if notes:
        lines += ["", "## What did not hold", "", *notes]
    return "\n".join(lines) + "\n"


def _notes(report: dict[str, Any]) -> list[str]:
    """One bullet per program and expectation that failed, with the reason the row keeps."""
    notes = [f"- the {kind} worker did not report: {why}"
             for kind, why in report["unavailable"].items()]
    for row in report["programs"]:
        name = f"{row['pair']} ({row['twin']})"
        values = row["values"] or {}
        if row["forced_manifestation_ok"] is False:
            notes.append(f"- {name}: wrong with delays {values['delayed_wrong']}/"
                         f"{report['trials']}, without {values['plain_wrong']}/"
                         f"{report['trials']} {values.get('sample', '')}".rstrip())
        for errors in values.get("errors", []):
            notes.append(f"- {name}: did not complete: {errors}")
        for mode in ("cpu", "gpu"):
            side = row[f"recorder_{mode}"]
            if side["meets_manifest"] is False:
                why = "; ".join(side.get("problems", [])) or side.get("error") or (
                    f"reported {side['keys']} on a fixed twin")
                notes.append(f"- {name}: recorder {mode.upper()} mode: {why}")
        if row["cpu_gpu_agree"] is False:
            notes.append(f"- {name}: CPU mode {row['recorder_cpu']['keys']}, GPU mode "
                         f"{row['recorder_gpu']['keys']}")
    return notes


def _git_commit() -> str:
    """The checked-out commit, with ``+dirty`` when files differ ("unknown" without git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, check=True, capture_output=True, text=True,
                               timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def _children_cpu_s() -> float:
    """CPU seconds of the finished worker processes (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    """Parse the command line; run a worker, or drive the workers and write the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=10, help="runs per program and setting")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "recorder")
    parser.add_argument("--only", action="append", default=[], help="a pair name (repeatable)")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    try:
        pairs = load_manifest()
    except ManifestError as exc:
        print(exc, file=sys.stderr)
        return 2
    unknown = sorted(set(args.only) - {p.name for p in pairs})
    if unknown:
        print(f"--only: no pair named {', '.join(unknown)} in corpus.toml", file=sys.stderr)
        return 2
    pairs = [p for p in pairs if not args.only or p.name in args.only]
    if args.worker:
        rows = run_worker(args.worker, pairs, args.trials)
        args.worker_out.write_text(json.dumps(rows), encoding="utf-8")
        if args.worker == "recorder-gpu":  # the GPU trace stays on: leave without teardown
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return 0
    if not torch.cuda.is_available():
        print("recorder_gpu_report: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    wall, cpu = time.perf_counter(), time.process_time()
    results = gather(args)
    rows = build_rows(pairs, results, args.trials)
    device = torch.cuda.get_device_name(0)
    report = {
        "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": driver_version(), "commit": _git_commit(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python3", "tools/recorder_gpu_report.py", *(argv or sys.argv[1:])]),
        "trials": args.trials, "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu + _children_cpu_s(),
        "unavailable": {k: v["unavailable"] for k, v in results.items() if "unavailable" in v},
        "programs": rows,
    }
    report["sums"] = sums(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{report['date'][:10]}-{device_slug(device)}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    stem.with_suffix(".md").write_text(render_markdown(report), encoding="utf-8")
    print(render_markdown(report), flush=True)
    print(f"wrote {stem}.json and .md", flush=True)
    ok = all(r["forced_manifestation_ok"] and r["recorder_cpu"]["meets_manifest"]
             and r["recorder_gpu"]["meets_manifest"] and r["cpu_gpu_agree"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
