"""The necessity table: every sync site removed in turn, every variant run without it.

Engine-neutral: an adapter hands over its sites and a function that runs one variant and
returns its outcome. The engine is imported once, in this process; each site's mutation runs
in a forked child (the mutation is never undone, the child just ends), ``jobs`` children at
a time. Per site and variant the verdict is necessary (races the intact code does not have,
listed with both lines), redundant (the site ran and nothing new raced), not reached (the
variant never ran the site's line) or error (the mutated run crashed, before the site's line
or after it).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from overlap_harness.engines.core.mutation import Coverage, remove_site
from overlap_harness.engines.core.results import (
    NecessityRow,
    VariantOutcome,
    Verdict,
    race_signature,
)
from overlap_harness.engines.core.sites import SiteKind, SyncSite

RunVariant = Callable[[str], VariantOutcome]

#: kinds a mutation removes; a non-blocking copy is listed but kept (removing it removes
#: the data, not an ordering)
MUTABLE_KINDS = frozenset(SiteKind) - {SiteKind.NON_BLOCKING_COPY}

T = TypeVar("T")
_STATE: dict[str, object] = {}  # what forked children inherit: the run function, variants


def _one_site(site: SyncSite) -> tuple[list[VariantOutcome], dict[str, int], str | None]:
    run: RunVariant = _STATE["run"]  # type: ignore[assignment]
    variants: Sequence[str] = _STATE["variants"]  # type: ignore[assignment]
    coverage = Coverage()
    try:
        remove_site(site, coverage)
    except Exception as exc:  # the site's function cannot be recompiled here
        return [], {}, f"{type(exc).__name__}: {exc}"
    outcomes = []
    for variant in variants:
        before = coverage.reached.get(site.key, 0)
        outcome = run(variant)
        coverage.reached[f"{variant}:{site.key}"] = coverage.reached.get(site.key, 0) - before
        outcomes.append(outcome)
    return outcomes, dict(coverage.reached), None


def necessity_table(sites: Sequence[SyncSite], variants: Sequence[str],
                    baseline: dict[str, VariantOutcome], run: RunVariant,
                    jobs: int = 1) -> list[NecessityRow]:
    """One row per mutable site and variant (see the module docstring)."""
    _STATE.update(run=run, variants=list(variants))
    mutable = [s for s in sites if s.kind in MUTABLE_KINDS]
    results = forked_map(_one_site, mutable, jobs)
    rows = []
    for site, (outcomes, reached, error) in zip(mutable, results, strict=True):
        for index, variant in enumerate(variants):
            rows.append(_row(site, variant, baseline[variant],
                             outcomes[index] if outcomes else None,
                             reached.get(f"{variant}:{site.key}", 0), error))
    return rows


def _row(site: SyncSite, variant: str, base: VariantOutcome, mutated: VariantOutcome | None,
         reached: int, error: str | None) -> NecessityRow:
    where = f"{os.path.abspath(site.file)}:{site.line}"
    row = NecessityRow(where, site.code, str(site.kind), variant, Verdict.ERROR,
                       reached=reached, error=error, function=site.function)
    if mutated is None:
        return row
    if mutated.error is not None:  # reached or not: a crash is never read as not reached
        row.error = mutated.error
        return row
    if not reached:
        row.verdict = Verdict.NOT_REACHED
        return row
    known = {race_signature(r) for r in base.races}
    row.races = [r for r in mutated.races if race_signature(r) not in known]
    row.verdict = Verdict.NECESSARY if row.races else Verdict.REDUNDANT
    return row


def format_error(exc: BaseException) -> str:
    """The message of a crash and the innermost frame outside this package (the engine's
    line that made the unplanned call, and its function), on one line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}engines{os.sep}core{os.sep}" not in f.filename]
    where = (f" at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}"
             if frames else "")
    return f"{type(exc).__name__}: {exc}{where}"


def _single_threaded_ops() -> None:
    """Run torch's CPU ops on the calling thread from now on: an OpenMP worker pool the parent
    already started does not exist in a forked child, and a child that enters a parallel
    region waits for it forever. The engines' tensors are a few elements; nothing is lost."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() > 1:
        torch.set_num_threads(1)


def forked_map(function: Callable[[Any], T], items: Sequence[Any], jobs: int) -> list[T]:
    """``[function(item) for item in items]``, each call in its own forked child (what it
    changes in the process dies with the child), ``jobs`` children at a time; results come
    back pickled through a pipe. A child that dies without answering raises."""
    _single_threaded_ops()
    results: dict[int, T] = {}
    running: dict[int, tuple[int, int]] = {}  # pid -> (item index, read end)
    pending = list(enumerate(items))
    while pending or running:
        while pending and len(running) < max(1, jobs):
            index, item = pending.pop(0)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: run, answer, exit without cleanup of the parent's state
                os.close(read_end)
                try:
                    payload = pickle.dumps(function(item))
                    with os.fdopen(write_end, "wb") as pipe:
                        pipe.write(payload)
                finally:
                    os._exit(0)
            os.close(write_end)
            running[pid] = (index, read_end)
        pid = next(iter(running))
        index, read_end = running.pop(pid)
        with os.fdopen(read_end, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        if not data:
            raise RuntimeError(f"the child for item {index} died without a result")
        results[index] = pickle.loads(data)
    return [results[i] for i in range(len(items))]
