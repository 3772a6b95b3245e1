"""A recorder's races in one plain form, and whether they meet the manifest's predictions.

The recorder reports a race as :class:`model.trace.Race` (``recorder.watch``) or as a JSON
object (``overlap-harness check --json``); :class:`SeenRace` is the part the corpus checks
either way: kind, tensor (``variable@file:line`` of its allocation), elements, and both
accesses' file, line, op and stream. :func:`mismatches` compares one with an
:class:`~tests.recorder_corpus.manifest.ExpectedRace` and says what differs, so a failing test
names the reason rather than only "no match".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.recorder_corpus.manifest import ExpectedRace, markers
from tests.recorder_corpus.runner import ProgramRun, run_program


@dataclass(frozen=True, slots=True)
class Site:
    """One access of a race: where the user's code issued it, the op, the stream."""

    file: str
    line: int
    op: str
    stream: str

    def is_in(self, program: Path) -> bool:
        """True when the access is in ``program`` (paths relative to the working directory
        are resolved as the recorder prints them)."""
        path = Path(self.file)
        path = path if path.is_absolute() else Path.cwd() / path
        return path.resolve() == program.resolve()


@dataclass(frozen=True, slots=True)
class SeenRace:
    """A race as a recorder reported it."""

    kind: str
    tensor: str
    elements: tuple[int, ...]
    sites: tuple[Site, Site]

    @property
    def variable(self) -> str:
        """The tensor's variable name (the part before ``@``)."""
        return self.tensor.split("@", 1)[0]

    @property
    def alloc_line(self) -> int | None:
        """The line of the tensor's allocation, when its name carries one."""
        tail = self.tensor.rsplit(":", 1)
        return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None

    def key(self) -> tuple[str, str, int, int]:
        """What two runs of one program must agree on: kind, variable, both lines (sorted)."""
        low, high = sorted(s.line for s in self.sites)
        return (self.kind, self.variable, low, high)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (elements as first, last and count: a race may cover many)."""
        elems = self.elements
        return {"kind": self.kind, "tensor": self.tensor,
                "elements": [elems[0], elems[-1], len(elems)] if elems else [],
                "sites": [{"file": s.file, "line": s.line, "op": s.op, "stream": s.stream}
                          for s in self.sites]}


def _split_site(source: str) -> tuple[str, int]:
    """``("prog.py", 12)`` from ``"prog.py:12"`` (line 0 when there is none)."""
    file, _, line = source.rpartition(":")
    return (file, int(line)) if line.isdigit() else (source, 0)


def from_race(race: Any) -> SeenRace:
    """A :class:`model.trace.Race` (``recorder.watch(...).races``) as a :class:`SeenRace`."""
    sites = []
    for access in (race.first, race.second):
        file, line = _split_site(access.source)
        sites.append(Site(file, line, access.op_name, access.agent))
    return SeenRace(str(race.kind), race.buffer, tuple(race.elements), (sites[0], sites[1]))


def from_json(entry: dict[str, Any]) -> SeenRace:
    """One race of ``overlap-harness check --json`` as a :class:`SeenRace`. Its ``elements``
    are ``[start, stop)`` runs (the check command's form) or plain element ids."""
    accesses = entry.get("accesses") or entry.get("sites") or [entry["first"], entry["second"]]
    sites = tuple(Site(str(a["file"]), int(a["line"]), str(a.get("op", "")),
                       str(a.get("stream", ""))) for a in accesses[:2])
    return SeenRace(str(entry["kind"]), str(entry["tensor"]),
                    _element_ids(entry.get("elements", ())), (sites[0], sites[1]))


def _element_ids(elements: Any) -> tuple[int, ...]:
    """Element ids from a list of ids or of ``[start, stop)`` runs."""
    ids: list[int] = []
    for item in elements:
        if isinstance(item, list | tuple):
            start, stop = item
            ids.extend(range(int(start), int(stop)))
        else:
            ids.append(int(item))
    return tuple(ids)


def mismatches(expected: ExpectedRace, seen: SeenRace, program: Path) -> list[str]:
    """Why ``seen`` is not the predicted race in ``program`` (empty when it is)."""
    marks = markers(program)
    reasons = []
    if seen.kind != expected.kind:
        reasons.append(f"kind {seen.kind} (expected {expected.kind})")
    alloc = marks[("alloc", expected.tensor)]
    if seen.variable != expected.tensor and seen.alloc_line != alloc:
        reasons.append(f"tensor {seen.tensor} (expected {expected.tensor}, allocated on "
                       f"line {alloc})")
    if not all(site.is_in(program) for site in seen.sites):
        reasons.append(f"sites {[s.file for s in seen.sites]} not all in {program.name}")
    lines = sorted(marks[("site", name)] for name in expected.sites)
    if sorted(s.line for s in seen.sites) != lines:
        reasons.append(f"lines {sorted(s.line for s in seen.sites)} (expected {lines}: "
                       f"{' and '.join(expected.sites)})")
    if expected.elements is not None:
        start, stop = expected.elements
        if sorted(set(seen.elements)) != list(range(start, stop)):
            got = f"{min(seen.elements)}..{max(seen.elements)}" if seen.elements else "none"
            reasons.append(f"elements {got} ({len(set(seen.elements))}; expected "
                           f"[{start}, {stop}))")
    return reasons


def unmatched(expected: tuple[ExpectedRace, ...], seen: list[SeenRace],
              program: Path) -> list[str]:
    """One line per predicted race that no reported race matches, with the nearest misses."""
    problems = []
    for race in expected:
        if any(not mismatches(race, s, program) for s in seen):
            continue
        near = [f"{s.kind} {s.tensor}: " + "; ".join(mismatches(race, s, program)) for s in seen]
        problems.append(f"{program.name}: no {race.kind} race on {race.tensor} at "
                        f"{'/'.join(race.sites)}; reported: {near or 'nothing'}")
    return problems


def watch_program(program: Path, mode: str) -> tuple[ProgramRun, list[SeenRace]]:
    """Run ``program`` under ``recorder.watch(mode=mode)``; its run and the races reported."""
    # Imported here: the recorder is optional for the corpus (plain runs, CSAN runs need none
    # of it) and loads torch's dispatch machinery.
    import overlap_harness.recorder as recorder
    with recorder.watch(mode=mode) as watched:
        run = run_program(program)
    return run, [from_race(r) for r in watched.races]
