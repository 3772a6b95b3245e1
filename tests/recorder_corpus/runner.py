"""Run one corpus program inside this process, as ``python prog.py`` would, and read its result.

Running in-process lets one interpreter (one torch import, one CUDA context) run the whole
corpus many times: tools/recorder_gpu_report.py repeats every program N times with and
without forced delays, and tests/recorder/test_corpus.py runs each under ``recorder.watch``.
The program runs as ``__main__`` with its own ``sys.argv``, with this folder first on
``sys.path`` (so ``import corpus_helper`` resolves as it does for ``python prog.py``), with its
standard output and error captured; ``CORPUS_DELAYS`` is set for the run only.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parent
RESULT_PREFIX = "CORPUS_RESULT "  # corpus_helper.RESULT_PREFIX (the programs' side)
DELAYS_ENV = "CORPUS_DELAYS"  # corpus_helper.DELAYS_ENV


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """What one run of a corpus program printed and raised.

    Args:
        path: the program.
        value: the result it printed (``None`` when it printed none).
        expected: the value its author meant, printed beside it.
        error_type: the exception's class name when the program raised, else ``None``.
        error: the exception's first line.
        output: everything the program printed on its standard output.
        errors_output: what it (or a checker such as CSAN) printed on standard error.
    """

    path: Path
    value: Any = None
    expected: Any = None
    error_type: str | None = None
    error: str = ""
    output: str = ""
    errors_output: str = ""

    @property
    def completed(self) -> bool:
        """True when the program ran to its end and printed its result."""
        return self.error_type is None and self.expected is not None

    @property
    def wrong(self) -> bool:
        """True when it completed with a value other than the one meant."""
        return self.completed and self.value != self.expected


def parse_result(output: str) -> dict[str, Any] | None:
    """The last ``CORPUS_RESULT`` line of ``output`` as a dict (None when there is none)."""
    lines = [ln for ln in output.splitlines() if ln.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None


@contextlib.contextmanager
def _program_context(path: Path, argv: tuple[str, ...], delays: bool):
    """``sys.argv``, ``sys.path`` and ``CORPUS_DELAYS`` as the program expects, restored after."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_env = os.environ.get(DELAYS_ENV)
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.parent))
    os.environ[DELAYS_ENV] = "1" if delays else "0"
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_env is None:
            os.environ.pop(DELAYS_ENV, None)
        else:
            os.environ[DELAYS_ENV] = saved_env


def run_program(path: Path, argv: tuple[str, ...] = (), delays: bool = False) -> ProgramRun:
    """Run ``path`` as ``__main__``; an exception it raises is caught and reported, not
    raised (a CSAN run ends in ``CUDASanitizerErrors``, a racy run may crash)."""
    captured, captured_errors = io.StringIO(), io.StringIO()
    error_type, error = None, ""
    with (_program_context(path, argv, delays), contextlib.redirect_stdout(captured),
          contextlib.redirect_stderr(captured_errors)):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                error_type, error = "SystemExit", f"exit status {exc.code}"
        except Exception as exc:  # the program's own failure is data here
            error_type = type(exc).__name__
            error = next((ln for ln in str(exc).splitlines() if ln.strip()), "")
    output = captured.getvalue()
    result = parse_result(output) or {}
    return ProgramRun(path, result.get("value"), result.get("expected"), error_type, error,
                      output, captured_errors.getvalue())
