"""Run a callable under PyTorch's CUDA sanitizer (CSAN) and collect its verdict.

CSAN (``torch.cuda._sanitizer``) checks every CUDA kernel a torch op launches against the
streams' vector clocks and raises ``CUDASanitizerErrors`` at the first op that conflicts; it is
the reference our detector is compared with. It tracks whole CUDA tensors (not rows) and not
host accesses to pinned memory, so it can flag what we call race-free and miss what we call a
race: :mod:`gpu_check.semantics_check` records both verdicts side by side.

Each call gets a fresh ``CUDASanitizerDispatchMode`` (a new clock state), entered only around
the callable, so one trace's history does not leak into the next. CSAN itself is enabled
process-wide by ``enable_cuda_sanitizer()`` or the ``TORCH_CUDA_SANITIZER`` environment
variable; :func:`enabled_by_env` says whether that is on, since then every run is checked.
The mode's trace callbacks stay registered afterwards (CSAN offers no way to remove them), so
run the plain, timed runs before the sanitized ones.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENV_VAR = "TORCH_CUDA_SANITIZER"


@dataclass(frozen=True, slots=True)
class SanitizerVerdict:
    """What CSAN said about one run.

    Args:
        flagged: CSAN raised ``CUDASanitizerErrors`` (it reports a race).
        errors: the first line of each error it reported.
        failure: another exception that stopped the run (``None`` when it completed).
        report: CSAN's full text, as it prints it to stderr.
    """

    flagged: bool
    errors: tuple[str, ...] = ()
    failure: str | None = None
    report: str = field(default="", repr=False)

    @property
    def verdict(self) -> str:
        """``"race"``, ``"race_free"`` or ``"error"``."""
        if self.failure is not None:
            return "error"
        return "race" if self.flagged else "race_free"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"verdict": self.verdict, "flagged": self.flagged, "errors": list(self.errors),
                "failure": self.failure}


def enabled_by_env(environ: dict[str, str] | None = None) -> bool:
    """True when ``TORCH_CUDA_SANITIZER`` turns CSAN on for the whole process."""
    env = os.environ if environ is None else environ
    return env.get(ENV_VAR, "") not in ("", "0")


def first_line(text: str) -> str:
    """The first line of a report that says something (not a ``====`` rule)."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip().strip("=")), "")


def summarize(error: Any) -> str:
    """One line for a CSAN error: both kernels, their streams and access types."""
    cur = getattr(error, "current_access", None)
    prev = getattr(error, "previous_access", None)
    if cur is None or prev is None:
        return first_line(str(error))
    return (f"{cur.operator} on stream {cur.stream} ({cur.type}) unsynchronized with "
            f"{prev.operator} on stream {prev.stream} ({prev.type})")


def run_sanitized(fn: Callable[[], Any]) -> tuple[SanitizerVerdict, Any]:
    """Run ``fn`` under a fresh CSAN dispatch mode; returns the verdict and ``fn``'s result
    (``None`` when CSAN or another exception stopped it)."""
    from torch.cuda._sanitizer import CUDASanitizerDispatchMode, CUDASanitizerErrors

    err = io.StringIO()
    mode = CUDASanitizerDispatchMode()
    try:
        with contextlib.redirect_stderr(err), mode:
            result = fn()
    except CUDASanitizerErrors as exc:
        lines = tuple(summarize(e) for e in exc.errors)
        return SanitizerVerdict(True, lines, None, err.getvalue()), None
    except Exception as exc:  # the verdict records it: the table shows CSAN could not run
        return SanitizerVerdict(False, (), f"{type(exc).__name__}: {exc}", err.getvalue()), None
    return SanitizerVerdict(False, (), None, err.getvalue()), result
