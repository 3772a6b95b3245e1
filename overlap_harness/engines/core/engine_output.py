"""The engines' own chatter while they load, held back and summed up in one line.

Importing SGLang or vLLM on a machine without CUDA prints their own warnings (Triton rolled
back to CPU, AWQ and GGUF need CUDA, "Cannot detect CUDA architecture", ...) that say nothing
about the check. They come three ways: ``warnings.warn``, a logger (SGLang's and vLLM's own
handlers, or Python's last-resort handler), and plain writes to ``sys.stdout`` or
``sys.stderr``. Inside :func:`captured` all three are collected in order, and at its end one
line goes to stderr (``sglang import: 4 engine warnings hidden (--verbose shows them)``), or,
after :func:`show_engine_output` (``--verbose``), the collected text itself. Our own output is
never inside the block, so it stays ours.

What is not caught: output written by C code straight to the file descriptors.
"""

from __future__ import annotations

import atexit
import io
import logging
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_SHOW = [False]  # --verbose: print what the engines said instead of the summary
_HELD: list[EngineOutput] = []  # what blocks without their own summary held back, this process


def show_engine_output(show: bool) -> None:
    """Print the engines' own output as it was (``--verbose``) rather than one summary line."""
    _SHOW[0] = show


@dataclass
class EngineOutput:
    """What an engine said inside :func:`captured`, in order: ``(is_warning, text)``."""

    said: list[tuple[bool, str]] = field(default_factory=list)

    @property
    def warnings(self) -> int:
        return sum(1 for is_warning, _ in self.said if is_warning)

    @property
    def messages(self) -> int:
        return len(self.said) - self.warnings

    def text(self) -> str:
        """Everything, as it would have been printed."""
        return "".join(text if text.endswith("\n") else text + "\n" for _, text in self.said)

    def summary(self, stage: str) -> str | None:
        """``sglang import: 4 engine warnings hidden (--verbose shows them)``; None when the
        engine said nothing."""
        if not self.said:
            return None
        parts = [f"{n} engine {word}{'' if n == 1 else 's'}"
                 for n, word in ((self.warnings, "warning"), (self.messages, "message")) if n]
        return f"{stage}: {' and '.join(parts)} hidden (--verbose shows them)"


class _Stream(io.TextIOBase):
    """A stand-in for stdout or stderr that keeps each line written to it."""

    def __init__(self, output: EngineOutput, is_warning: bool, real: object) -> None:
        self.output, self.is_warning, self.real = output, is_warning, real
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        self.output.said.extend((self.is_warning, line) for line in lines if line.strip())
        return len(text)

    def flush(self) -> None:
        if self.pending.strip():
            self.output.said.append((self.is_warning, self.pending))
        self.pending = ""

    def isatty(self) -> bool:
        return False


_FORMAT = logging.Formatter("%(levelname)s %(name)s: %(message)s")


def _would_emit(logger: logging.Logger, record: logging.LogRecord) -> bool:
    """Would ``logger`` print ``record`` through some handler (its own or an ancestor's, or
    the last-resort handler when there is none)? The walk is the logging module's own rule."""
    found = False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            found = True
            if record.levelno >= handler.level and handler.filter(record):
                return True
        current = current.parent if current.propagate else None
    last = logging.lastResort
    return not found and last is not None and record.levelno >= last.level


@contextmanager
def captured(stage: str, summary: bool = True) -> Iterator[EngineOutput]:
    """Collect the engines' warnings, log records and prints inside the block; at its end
    print one summary line (named ``stage``, e.g. ``sglang import``) or, with
    :func:`show_engine_output`, what they said. Without ``summary`` the blocks of a process
    are summed up together in one line when it ends (``engine runs: ...``). See the module
    doc."""
    output = EngineOutput()
    real_out, real_err = sys.stdout, sys.stderr
    fake_out = _Stream(output, False, real_out)
    fake_err = _Stream(output, True, real_err)
    call_handlers = logging.Logger.callHandlers

    def keep_record(logger: logging.Logger, record: logging.LogRecord) -> None:
        if _would_emit(logger, record):
            output.said.append((record.levelno >= logging.WARNING, _FORMAT.format(record)))

    def keep_warning(message: Warning | str, category: type[Warning], filename: str,
                     lineno: int, file: object = None, line: str | None = None) -> None:
        output.said.append((True, warnings.formatwarning(message, category, filename, lineno,
                                                         line)))

    with warnings.catch_warnings():
        warnings.showwarning = keep_warning
        logging.Logger.callHandlers = keep_record  # type: ignore[method-assign]
        sys.stdout, sys.stderr = fake_out, fake_err
        try:
            yield output
        finally:
            sys.stdout, sys.stderr = real_out, real_err
            logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign]
            fake_out.flush()
            fake_err.flush()
            _give_streams_back({fake_out: real_out, fake_err: real_err})
            if _SHOW[0]:
                real_err.write(output.text())
            elif summary and (line := output.summary(stage)) is not None:
                print(line, file=real_err)
            elif output.said:
                _hold(output)


def _hold(output: EngineOutput) -> None:
    """Keep ``output`` for the one line said when this process ends (a forked child ends
    with ``os._exit`` and says nothing)."""
    if not _HELD:
        atexit.register(say_held)
    _HELD.append(output)


def say_held() -> None:
    """Say the one line for the engine output held so far, now (a command's failure line is
    then its last), and forget it."""
    held = EngineOutput([said for output in _HELD for said in output.said])
    _HELD.clear()
    if (line := held.summary("engine runs")) is not None:
        print(line, file=sys.stderr)


def _give_streams_back(replaced: dict[_Stream, object]) -> None:
    """Handlers configured inside the block (vLLM's logger writes to the ``sys.stdout`` of
    its import) write to the real stream again."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict
                                      .values() if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and stream in replaced:
                handler.setStream(replaced[stream])  # type: ignore[arg-type]
