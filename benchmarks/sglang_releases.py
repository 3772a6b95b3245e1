"""What driving each SGLang release costs (issue 32): the import of its overlap path (the
scheduler and the modules the driver loads, ``environment.load``) and the run of the default
variants (``overlap-harness sglang --sglang-src TREE``), each in a fresh process, CPU seconds
(user + system of the child, ``resource.getrusage(RUSAGE_CHILDREN)``) beside wall seconds;
with the run's variants run, not applicable, races and exit status.

Usage: ``python benchmarks/sglang_releases.py [--releases-root DIR] [--config KEY=VALUE ...]
[VERSION ...]``; a release's tree is ``DIR/VERSION`` (default: the cache
``releases.release_tree`` fills); ``--config`` is passed to the run (the variants of one SGLang
configuration; the others are counted as not selected).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

IMPORT = ("import sys\nfrom overlap_harness.engines.sglang import environment\n"
          "environment.load(sys.argv[1])\n")


def _child(args: list[str]) -> tuple[int, float, float]:
    """Exit status, wall and CPU seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done.returncode, wall, cpu


def _tree(version: str, root: Path | None) -> Path:
    if root is not None:
        return root / version
    from overlap_harness.engines.sglang import releases

    return releases.release_tree(version)


def measure(version: str, root: Path | None, config: list[str]) -> dict:
    """One release's row."""
    tree = _tree(version, root)
    status, import_wall, import_cpu = _child([sys.executable, "-c", IMPORT, str(tree)])
    if status != 0:
        raise SystemExit(f"{version}: the import failed (exit {status})")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "loop.json"
        status, run_wall, run_cpu = _child([sys.executable, "-m", "overlap_harness", "sglang",
                                            "--sglang-src", str(tree), "--json", str(out),
                                            *[a for item in config for a in ("--config", item)]])
        document = json.loads(out.read_text()) if out.exists() else {}
    return {"version": version, "import_wall": import_wall, "import_cpu": import_cpu,
            "run_wall": run_wall, "run_cpu": run_cpu, "exit": status,
            "ran": len(document.get("variants", [])),
            "not_applicable": len(document.get("not_applicable", [])),
            "not_selected": len(document.get("not_selected", [])),
            "races": len(document.get("races", [])),
            "errors": len(document.get("errors", []))}


def main() -> None:
    from overlap_harness.engines.sglang import releases

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", default=list(releases.SUPPORTED))
    parser.add_argument("--releases-root", type=Path, default=None)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.config:
        print(f"--config {' --config '.join(args.config)}")
    print("| release | import wall (s) | import CPU (s) | run wall (s) | run CPU (s) | "
          "variants run | not applicable | not selected | cannot be driven | races | exit |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for version in args.versions:
        row = measure(version, args.releases_root, args.config)
        print(f"| {row['version']} | {row['import_wall']:.1f} | {row['import_cpu']:.1f} | "
              f"{row['run_wall']:.1f} | {row['run_cpu']:.1f} | {row['ran']} | "
              f"{row['not_applicable']} | {row['not_selected']} | {row['errors']} | "
              f"{row['races']} | {row['exit']} |", flush=True)


if __name__ == "__main__":
    main()
