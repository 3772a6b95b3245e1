"""Which host synchronisations does a device run of SGLang's loop make, and from whose code?

A GPU trial can make a race only where nothing makes the host wait for the delayed stream
between the race's two sides. SGLang's own code makes its waits on purpose; the harness's
stand-ins (``overlap_harness/engines/sglang/stand_ins/``) must make none, or they order the
device run where the real server does not (a ``timing`` row the CPU mode cannot explain). This
runs each variant once on the device, unforced, under ``torch.cuda.set_sync_debug_mode
("warn")`` (torch warns at every op that synchronises the host with the device: a host read of
a device value, a blocking copy), and counts each warning at the first frame of SGLang's or the
harness's code on its Python stack, classed ``sglang``, ``stand_in`` (the harness's stand-ins
and drivers), ``instrument`` (the GPU mode's own: the serial run's and the comparison's reads)
or ``other``.

Usage, on a CUDA host with SGLang importable: ``python tools/gpu_host_syncs.py OUT.json
[VARIANT ...]`` (default: every variant).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.sglang.gpu.probe import short_path

_SYNC_WARNING = "synchroniz"  # torch's text: "called a synchronizing CUDA operation"
_INSTRUMENT = "overlap_harness/engines/sglang/gpu/"
_HARNESS = "overlap_harness/"


def _first_code_frame(stack: list[traceback.FrameSummary]) -> str:
    """``path:line`` of the innermost frame in SGLang's or the harness's code (this tool's
    and the warning machinery's own frames skipped)."""
    for frame in reversed(stack):
        path = short_path(frame.filename)
        if path.endswith("tools/gpu_host_syncs.py") or "warnings" in path:
            continue
        if path.startswith((_HARNESS, "sglang/")):
            return f"{path}:{frame.lineno}"
    return "?"


def classify(location: str) -> str:
    """``sglang``, ``instrument``, ``stand_in`` or ``other`` for a ``path:line``."""
    if location.startswith("sglang/"):
        return "sglang"
    if location.startswith(_INSTRUMENT):
        return "instrument"
    if location.startswith(_HARNESS):
        return "stand_in"
    return "other"


def host_syncs(variant: str) -> dict[str, Any]:
    """One unforced device run of ``variant``: each synchronising op's location and count."""
    from overlap_harness.engines.sglang.gpu.loop import Forcing, run_trial

    counts: dict[str, int] = {}
    previous = warnings.showwarning

    def seen(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if _SYNC_WARNING in str(message):
            where = _first_code_frame(traceback.extract_stack())
            counts[where] = counts.get(where, 0) + 1
        else:
            previous(message, category, filename, lineno, *rest)

    started = time.perf_counter()
    warnings.showwarning = seen
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trial = run_trial(variant, Forcing(), None)[0]
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = previous
    by_class: dict[str, int] = {}
    for where, times in counts.items():
        by_class[classify(where)] = by_class.get(classify(where), 0) + times
    return {"variant": variant, "error": trial.error, "seconds": round(
        time.perf_counter() - started, 2), "by_class": by_class,
        "syncs": dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def main(argv: list[str]) -> int:
    """Write the JSON report (device, torch, one entry per variant) to ``argv[0]``."""
    from overlap_harness.engines.sglang.variants import VARIANTS

    if not argv:
        print(__doc__)
        return 2
    from overlap_harness.engines.sglang import environment

    names = argv[1:] or list(VARIANTS)
    # SGLang loaded as the table's children load it (the tree, the stand-ins of what this
    # host lacks, e.g. the compiled sgl_kernel): without it every variant's import fails
    environment.load(os.environ.get("OVERLAP_HARNESS_SGLANG_SRC") or None)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "command": "python tools/gpu_host_syncs.py "
           + " ".join(["OUT.json", *argv[1:]]), "variants": []}
    for name in names:
        entry = host_syncs(name)
        out["variants"].append(entry)
        print(f"{name}: {entry['by_class']} {entry['error'] or ''}", flush=True)
        Path(argv[0]).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
