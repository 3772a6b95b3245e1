"""What the vLLM variant tests compare races by: kind and both sides' file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pairs(watcher: Any) -> set[tuple[str, str, str]]:
    """(kind, first file:line, second file:line) of every race, files by base name."""
    def short(source: str) -> str:
        file, _, line = source.rpartition(":")
        return f"{Path(file).name}:{line}"
    return {(str(r.kind), short(r.first.source), short(r.second.source))
            for r in watcher.races}
