"""How the command line reads its options: numbers checked for their range as they are
parsed, and usage errors as one line.

Every numeric option of every command takes its ``type=`` from here (:func:`count` for whole
numbers, :func:`seconds` for durations), so a value out of range (``--time-limit -1``,
``-j 0``, ``--trials nan``) is refused while the arguments are parsed, before any work, with
the option's name, the range and the value given. :class:`OneLineParser` prints that
refusal, and every other usage error, as one line on stderr (exit 2), with a pointer to
``--help`` instead of the usage block.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``prog: error: reason (see
    prog --help)``, exit 2. Subcommand parsers made from it are of this class too."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` as one line and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count(at_least: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``at_least``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number of at least {at_least}, got {text!r}") from None
        if value < at_least:
            raise argparse.ArgumentTypeError(
                f"expected a whole number of at least {at_least}, got {value}")
        return value

    return parse


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text}")
    return value
