"""The corpus manifest (corpus.toml): each racy/fixed pair and the races its racy twin must show.

Used by tests/recorder/test_corpus.py, tests/recorder/test_gpu_report.py and
tools/recorder_gpu_report.py. The expectations are read from the manifest and the programs'
marker comments, never from a recorder run:

- ``# corpus-site: NAME`` marks a line that is one access of a predicted race;
- ``# corpus-alloc: NAME`` marks the line that allocates the tensor ``NAME``;
  several markers share a line as ``# corpus-site: d2h, corpus-alloc: on_host``.

:func:`load_manifest` checks the whole file (unknown keys, race kinds, missing programs,
markers a race names but its program lacks) and raises one :class:`ManifestError` that lists
every problem, one line each.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
MANIFEST = CORPUS_DIR / "corpus.toml"
RACE_KINDS = ("RAW", "WAR", "WAW", "host-D2H", "reuse")  # model.trace.RaceKind's values
_MARKER = re.compile(r"corpus-(site|alloc):\s*([A-Za-z_][A-Za-z0-9_]*)")
_PAIR_KEYS = {"name", "covers", "race", "gpu_pending"}
_RACE_KEYS = {"kind", "tensor", "sites", "elements"}


class ManifestError(ValueError):
    """The manifest or a program's markers are wrong; ``str()`` lists every problem."""


@dataclass(frozen=True, slots=True)
class ExpectedRace:
    """A race STREAM-SEMANTICS.md predicts for a racy twin.

    Args:
        kind: the race kind, one of :data:`RACE_KINDS`.
        tensor: the variable the racing tensor's allocation is assigned to.
        sites: the two ``corpus-site`` markers of the racing accesses.
        elements: ``(start, stop)`` of the storage's flat elements both touch, when pinned down.
    """

    kind: str
    tensor: str
    sites: tuple[str, str]
    elements: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Pair:
    """One racy program and its fixed twin.

    Args:
        name: the pair's name; the programs are ``<name>_racy.py`` and ``<name>_fixed.py``.
        covers: the issue item and STREAM-SEMANTICS rule it stands for.
        races: what the racy twin must report (the fixed twin: nothing).
        gpu_pending: added after the newest GPU report (reports/recorder/): not in it yet,
            until a GPU run covers it and the mark is removed.
    """

    name: str
    covers: tuple[str, ...]
    races: tuple[ExpectedRace, ...]
    gpu_pending: bool = False

    @property
    def racy_path(self) -> Path:
        """The racy twin's file."""
        return CORPUS_DIR / f"{self.name}_racy.py"

    @property
    def fixed_path(self) -> Path:
        """The fixed twin's file."""
        return CORPUS_DIR / f"{self.name}_fixed.py"


def markers(path: Path) -> dict[tuple[str, str], int]:
    """``{("site"|"alloc", NAME): line}`` of every marker comment in ``path`` (1-based)."""
    found: dict[tuple[str, str], int] = {}
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if "#" in text:
            for role, name in _MARKER.findall(text.split("#", 1)[1]):
                found[(role, name)] = number
    return found


def _race(entry: object, where: str, problems: list[str]) -> ExpectedRace | None:
    """One ``[[pair.race]]`` table, or None after adding its problems."""
    if not isinstance(entry, dict):
        problems.append(f"{where}: expected a table")
        return None
    before = len(problems)
    for key in sorted(set(entry) - _RACE_KEYS):
        problems.append(f"{where}.{key}: unknown key (expected one of {sorted(_RACE_KEYS)})")
    kind, tensor, sites = entry.get("kind"), entry.get("tensor"), entry.get("sites")
    elements = entry.get("elements")
    if kind not in RACE_KINDS:
        problems.append(f"{where}.kind: expected one of {'|'.join(RACE_KINDS)}, got {kind!r}")
    if not isinstance(tensor, str) or not tensor:
        problems.append(f"{where}.tensor: expected a variable name, got {tensor!r}")
    if not (isinstance(sites, list) and len(sites) == 2 and all(isinstance(s, str) for s in sites)):
        problems.append(f"{where}.sites: expected two marker names, got {sites!r}")
    if elements is not None and not (
        isinstance(elements, list) and len(elements) == 2
        and all(isinstance(x, int) for x in elements) and 0 <= elements[0] < elements[1]
    ):
        problems.append(f"{where}.elements: expected [start, stop) with start < stop, "
                        f"got {elements!r}")
        elements = None
    if len(problems) > before:
        return None
    return ExpectedRace(str(kind), str(tensor), (sites[0], sites[1]),
                        None if elements is None else (elements[0], elements[1]))


def _pair(entry: object, where: str, problems: list[str]) -> Pair | None:
    """One ``[[pair]]`` table, its programs and their markers checked."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        problems.append(f"{where}: expected a table with a string `name`")
        return None
    name = entry["name"]
    where = f"{where} ({name})"
    for key in sorted(set(entry) - _PAIR_KEYS):
        problems.append(f"{where}.{key}: unknown key (expected one of {sorted(_PAIR_KEYS)})")
    races = [_race(r, f"{where}.race[{i}]", problems) for i, r in enumerate(entry.get("race", []))]
    if not races:
        problems.append(f"{where}.race: a racy twin must predict at least one race")
    pending = entry.get("gpu_pending", False)
    if not isinstance(pending, bool):
        problems.append(f"{where}.gpu_pending: expected true or false, got {pending!r}")
    pair = Pair(name, tuple(entry.get("covers", ())), tuple(r for r in races if r is not None),
                pending is True)
    for path in (pair.racy_path, pair.fixed_path):
        if not path.is_file():
            problems.append(f"{where}: program {path.name} is missing from {CORPUS_DIR}")
    if pair.racy_path.is_file():
        marks = markers(pair.racy_path)
        for race in pair.races:
            wanted = [("site", s) for s in race.sites] + [("alloc", race.tensor)]
            for role, marker in wanted:
                if (role, marker) not in marks:
                    problems.append(f"{where}: {pair.racy_path.name} has no "
                                    f"`# corpus-{role}: {marker}` marker")
    return pair


def load_manifest(path: Path = MANIFEST) -> list[Pair]:
    """Every pair of the manifest, in file order; raises :class:`ManifestError` listing all
    problems (file, pair, key, reason) when anything is wrong."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    problems: list[str] = []
    pairs = [_pair(e, f"pair[{i}]", problems) for i, e in enumerate(data.get("pair", []))]
    names = [p.name for p in pairs if p is not None]
    twice = sorted({n for n in names if names.count(n) > 1})
    problems += [f"pair {n!r}: named twice" for n in twice]
    if not names:
        problems.append("no [[pair]] tables")
    if problems:
        raise ManifestError("\n".join(f"{path.name}: {p}" for p in problems))
    return [p for p in pairs if p is not None]


def corpus_programs(pairs: list[Pair]) -> list[tuple[Pair, bool]]:
    """Every program of ``pairs`` as ``(pair, racy)``: racy twin, then its fixed twin."""
    return [(pair, racy) for pair in pairs for racy in (True, False)]
