"""A synthetic profile document for the CPU tests: every figure present, easy numbers."""

from __future__ import annotations

from typing import Any

from overlap_harness.model.profile import FORMAT, HARNESS_KINDS, ISSUE_KINDS, SIZE_SERIES


def fig(median: float, spread: float = 0.0, n: int = 10) -> dict[str, Any]:
    """A figure table with ``median`` and a symmetric spread."""
    return {"median": median, "p10": max(0.0, median - spread), "p90": median + spread, "n": n}


def profile_doc(system_us: float = 4.0, harness_us: float = 100.0) -> dict[str, Any]:
    """A valid profile: each system issue cost ``system_us``, each harness cost
    ``harness_us`` (sync_return 20, extra durations 30 kernel / 10 copy), durations
    ``5 + bytes/1024 * 0.01`` µs for every series."""
    return {
        "format": FORMAT, "device": "Synthetic GPU", "driver": "0.0", "torch": "2.13",
        "cuda": "13.0", "python": "3.11", "date": "2026-11-23T00:00:00+00:00",
        "command": "overlap-harness calibrate --out x.json", "sleep_cycles_per_us": 1900.0,
        "system": {
            "issue_us": {k: fig(system_us, 1.0) for k in ISSUE_KINDS},
            "sync_to_launch_us": fig(8.0, 2.0),
            "durations": {k: [{"bytes": b, "us": fig(5 + b / 1024 * 0.01)}
                              for b in (4096, 65536, 1 << 20)] for k in SIZE_SERIES},
        },
        "harness": {
            "issue_us": {k: fig(20.0 if k == "sync_return" else harness_us, 5.0)
                         for k in HARNESS_KINDS},
            "extra_us": {"kernel": fig(30.0), "copy": fig(10.0)},
            "issue_by_op_us": {}, "extra_by_op_us": {},
        },
        "notes": ["synthetic"],
    }
