"""The corpus programs' one shared helper: where a forced delay goes, and the printed result.

The programs in this folder are user code written for ``torch.cuda``; they import nothing of
the harness but this module (it sits beside them, so ``python prog.py`` finds it).

- :func:`corpus_delay` marks the point where a delay on a stream makes a program's race show as
  a wrong value on a real GPU. It does nothing unless ``CORPUS_DELAYS=1`` is set, so the
  recorder and plain runs see the program without it; with it, the stream sleeps
  (``torch.cuda._sleep``) before the work issued next on it.
- :func:`corpus_report` prints the program's result beside the value its author meant, as one
  ``CORPUS_RESULT {json}`` line that ``tools/recorder_gpu_report.py`` reads back.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

DELAYS_ENV = "CORPUS_DELAYS"
RESULT_PREFIX = "CORPUS_RESULT "
# torch.cuda._sleep counts GPU clock cycles. About 2 GHz: the H100 SXM boost clock is
# 1.98 GHz (NVIDIA H100 datasheet); the delays only need to be long beside a launch (~10 µs).
CYCLES_PER_US = 2000


def delays_enabled() -> bool:
    """True when ``CORPUS_DELAYS=1``: the forced delays are on (read at each call, so one
    process can run a program with and without them)."""
    return os.environ.get(DELAYS_ENV, "0") == "1"


def corpus_delay(stream: torch.cuda.Stream, microseconds: int) -> None:
    """Make ``stream`` sleep ``microseconds`` before its next op, when delays are on."""
    if not delays_enabled():
        return
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(microseconds * CYCLES_PER_US))


def corpus_report(name: str, value: list[Any], expected: list[Any]) -> None:
    """Print the program's result and the value it should have, as one JSON line."""
    line = json.dumps({"program": name, "value": value, "expected": expected,
                       "ok": value == expected})
    print(RESULT_PREFIX + line, flush=True)
