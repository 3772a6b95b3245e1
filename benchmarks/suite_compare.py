"""The bundled suite's time in two source trees, side by side, alternating, cold each time.

    python benchmarks/suite_compare.py BEFORE_TREE AFTER_TREE [--rounds 2] [--after-args "-j 1"]

Each round runs, in each tree and in turn, ``python -m overlap_harness run scenarios/ -q``
with its default reports (into a fresh temporary folder) and with ``--no-reports --json``.
Every run is a new process with an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` in a
fresh folder), so a one-off compile counts, as on a fresh machine. Printed per run: wall
seconds and CPU seconds of the process and its children (plot and run workers; the
machine is shared: CPU is the steadier figure), the exit status, and the 1-minute load
average when it started (what else the machine was doing). A tree is a checkout, e.g. ``git
worktree add --detach /tmp/before <commit>``; its own sources are put first on
``PYTHONPATH``.

After each pair of runs the outputs of the two trees are compared: the ``--json`` results
byte for byte, and in the report folders every file of the same name, byte for byte
(``.json.gz`` decompressed: gzip stores no time here, but compare what it holds; the HTML
summary without its embedded PNGs). PNGs that differ in bytes are compared pixel by pixel:
the largest channel difference is printed. junit.xml holds each run's wall time, so it
differs from run to run; the rest should not. A file only one tree writes is named.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


def run_suite(tree: Path, out: Path, reports: bool, extra: Sequence[str] = ()
              ) -> tuple[float, float, int]:
    """(wall s, CPU s, exit status) of one cold suite run in ``tree``, writing into ``out``
    (the report folder, or the JSON results with ``reports=False``); ``extra``: more
    arguments for ``run``."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, PYTHONPATH=str(tree), TORCHINDUCTOR_CACHE_DIR=scratch)
        where = ["--out", str(out)] if reports else ["--no-reports", "--json", str(out)]
        cmd = [sys.executable, "-m", "overlap_harness", "run", "scenarios/", "-q", *where,
               *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wall = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - wall
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


_EMBEDDED_PNG = re.compile(rb"data:image/png;base64,[A-Za-z0-9+/=]*")


def _content(path: Path) -> bytes:
    """What a report file holds: ``.gz`` decompressed; in the HTML summary the embedded
    PNGs are cut out (they are compared as the plots/ files)."""
    data = path.read_bytes()
    data = gzip.decompress(data) if path.suffix == ".gz" else data
    return _EMBEDDED_PNG.sub(b"data:image/png;base64,...", data) if path.suffix == ".html" \
        else data


def _pixel_difference(before: Path, after: Path) -> int:
    """The largest difference of one colour channel between two PNGs (255 for another
    size): 0 is the same picture in other bytes."""
    # deferred: Pillow, only when two PNGs differ in bytes
    import numpy as np
    from PIL import Image

    a = np.asarray(Image.open(before).convert("RGBA"), dtype=np.int16)
    b = np.asarray(Image.open(after).convert("RGBA"), dtype=np.int16)
    return 255 if a.shape != b.shape else int(np.abs(a - b).max())


def _name(path: Path, root: Path) -> str:
    """A file's name in its folder, ``.gz`` dropped (a results file is gzipped by size)."""
    return str(path.relative_to(root)).removesuffix(".gz")


def compare_outputs(before: Path, after: Path) -> str:
    """One line: how the two trees' outputs (a JSON file, or two report folders) compare."""
    if before.is_file() or after.is_file():
        same = before.is_file() and after.is_file() and _content(before) == _content(after)
        return f"JSON results {'byte-identical' if same else 'DIFFER'}"
    old = {_name(p, before): p for p in before.rglob("*") if p.is_file()}
    new = {_name(p, after): p for p in after.rglob("*") if p.is_file()}
    differ = sorted(n for n in old.keys() & new.keys() if _content(old[n]) != _content(new[n]))
    pngs = [n for n in differ if n.endswith(".png")]
    differ = [n for n in differ if not n.endswith(".png")]
    lines = [f"{len(old.keys() & new.keys()) - len(differ) - len(pngs)} of "
             f"{len(old.keys() | new.keys())} report files identical (summary.html without "
             "its embedded PNGs)"]
    if pngs:
        worst = max(_pixel_difference(old[n], new[n]) for n in pngs)
        lines.append(f"{len(pngs)} PNGs differ in bytes, pixels by at most {worst} of 255 "
                     "in a channel")
    if differ:
        lines.append("differ: " + ", ".join(differ[:8]) + (" ..." if len(differ) > 8 else ""))
    for label, names in (("only before", old.keys() - new.keys()),
                         ("only after", new.keys() - old.keys())):
        if names:
            lines.append(f"{label}: " + ", ".join(sorted(names)[:8]))
    return "; ".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--after-args", default="", metavar="ARGS",
                    help="more arguments for the after tree's run (e.g. \"-j 1\")")
    args = ap.parse_args()
    extra = {"before": [], "after": shlex.split(args.after_args)}
    print("| round | tree | reports | wall s | CPU s | exit | load avg |")
    print("|---:|---|---|---:|---:|---:|---:|")
    notes = []
    for rnd in range(1, args.rounds + 1):
        for reports in (True, False):
            with tempfile.TemporaryDirectory() as scratch:
                outs = {}
                for name, tree in (("before", args.before), ("after", args.after)):
                    outs[name] = Path(scratch) / (name if reports else f"{name}.json")
                    load = os.getloadavg()[0]
                    wall, cpu, code = run_suite(tree.resolve(), outs[name], reports,
                                                extra[name])
                    print(f"| {rnd} | {name} | {'default' if reports else '--no-reports'} "
                          f"| {wall:.2f} | {cpu:.2f} | {code} | {load:.1f} |", flush=True)
                notes.append(f"round {rnd}, {'default' if reports else '--no-reports'}: "
                             + compare_outputs(outs["before"], outs["after"]))
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
