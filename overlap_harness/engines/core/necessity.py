"""The necessity table: every sync site removed in turn, every variant run without it.

Engine-neutral: an adapter hands over its sites and a function that runs one variant and
returns its outcome. The engine is imported once, in this process; each site's mutation runs
in a forked child (the mutation is never undone, the child just ends), ``jobs`` children at
a time. Per site and variant the verdict is necessary (races the intact code does not have,
listed with both lines), redundant (the site ran and nothing new raced), not reached (the
variant never ran the site's line) or error (the mutated run crashed, before the site's line
or after it).

Before the sites, one probed pass (:mod:`overlap_harness.engines.core.reach`, ``jobs``
children sharing the variants) finds which sites each variant's intact run reaches; a site's
child runs only the variants that reach it, and a site no variant reaches needs no child: its
rows are "not reached" as they would be after the run (a removal never reached leaves the
run as it was). An adapter that ran its intact variants with the probes in place
(:class:`~overlap_harness.engines.core.reach.IntactReach`) hands their reach over, and no
probed pass runs. Progress lines (:mod:`overlap_harness.engines.core.progress`) say which site
and variant the children are at, with the time so far and an estimate of what is left; the
engine's own log lines in the children are held back (shown with ``--verbose``,
:mod:`overlap_harness.engines.core.engine_output`), so they do not bury the progress.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from overlap_harness.engines.core.engine_output import captured
from overlap_harness.engines.core.interrupted import Interrupted, stop_children
from overlap_harness.engines.core.mutation import Coverage, parsed, remove_site
from overlap_harness.engines.core.progress import Progress
from overlap_harness.engines.core.reach import IntactReach, probe_key, reached_by_variant
from overlap_harness.engines.core.results import (
    NecessityRow,
    VariantOutcome,
    Verdict,
    race_signature,
    shown_file,
)
from overlap_harness.engines.core.sites import SiteKind, SyncSite

RunVariant = Callable[[str], VariantOutcome]

#: kinds a mutation removes; a non-blocking copy is listed but kept (removing it removes
#: the data, not an ordering)
MUTABLE_KINDS = frozenset(SiteKind) - {SiteKind.NON_BLOCKING_COPY}

T = TypeVar("T")
INTERRUPTED_STATUS = 130  # a forked child's exit status after Ctrl-C
_STATE: dict[str, object] = {}  # what forked children inherit: the run function, variants


def _one_site(planned: tuple[int, SyncSite, list[str]]
              ) -> tuple[list[VariantOutcome], dict[str, int], str | None]:
    position, site, variants = planned
    run: RunVariant = _STATE["run"]  # type: ignore[assignment]
    progress: Progress = _STATE["progress"]  # type: ignore[assignment]
    planned_runs = [len(plan) for _, _, plan in _STATE["planned"]]  # type: ignore[attr-defined]
    runs_done = sum(planned_runs[:_STATE["done"]])  # type: ignore[misc]  (finished in order)
    total = len(planned_runs)
    coverage = Coverage()
    try:
        remove_site(site, coverage)
    except Exception as exc:  # the site's function cannot be recompiled here
        return [], {}, f"{type(exc).__name__}: {exc}"
    outcomes = []
    for number, variant in enumerate(variants):
        progress.step(f"site {position + 1}/{total} {_short(site.key)}, variant {variant} "
                      f"({number + 1}/{len(variants)})",
                      (runs_done + number) / sum(planned_runs),
                      major=number == 0)
        before = coverage.reached.get(site.key, 0)
        with captured(f"{variant} run", summary=False), _verdicts_only():
            outcome = run(variant)  # (captured: the engine's own log lines)
        coverage.reached[f"{variant}:{site.key}"] = coverage.reached.get(site.key, 0) - before
        outcomes.append(outcome)
    return outcomes, dict(coverage.reached), None


def _verdicts_only() -> Any:
    """Around a child's run: the recorder counts no loop passes (a line tracer that costs
    every frame), since only the run's races are read, each with the iteration the engine's
    driver names; never the counted marks. Imported here: it imports torch, which the
    table's importers (pytest plugins) do not load before an engine does."""
    from overlap_harness.recorder.iterations import loops_not_counted

    return loops_not_counted()


def _short(key: str) -> str:
    """``scheduler.py:1402`` for ``.../sglang/srt/managers/scheduler.py:1402``."""
    return os.path.basename(key)


def _reach(variants: list[str]) -> tuple[set[str], dict[str, set[str]]]:
    progress: Progress = _STATE["progress"]  # type: ignore[assignment]
    progress.step(f"which sites the intact runs reach ({', '.join(variants)})", 0.0)
    with captured("probed runs", summary=False), _verdicts_only():  # (captured: the
        return reached_by_variant(_STATE["sites"], variants,  # engine's own log lines)
                                  _STATE["run"])  # type: ignore[arg-type]


def _plans(mutable: Sequence[SyncSite], variants: Sequence[str], jobs: int,
           reach: IntactReach | None = None) -> list[list[str]]:
    """Per site, the variants to run with it removed: those whose intact run reaches it
    (every variant for a site that could not be probed, a variant whose probed run crashed,
    or with one site only and no ``reach`` of the intact runs)."""
    probed: set[str] = set()
    reached: dict[str, set[str]] = {}
    if reach is not None:  # the intact runs were probed: no pass of its own
        probed, reached = reach.probed, reach.reached
    elif len(mutable) < 2:  # the probed pass would cost as much as it saves
        return [list(variants) for _ in mutable]
    else:
        shares = [list(variants[i::max(1, jobs)])
                  for i in range(min(max(1, jobs), len(variants)))]
        for share_probed, share_reached in forked_map(_reach, shares, jobs):
            probed |= share_probed
            reached.update(share_reached)
    keys = [probe_key(site) for site in mutable]
    return [[v for v in variants if key not in probed or v not in reached or key in reached[v]]
            for key in keys]


def necessity_table(sites: Sequence[SyncSite], variants: Sequence[str],
                    baseline: dict[str, VariantOutcome], run: RunVariant,
                    jobs: int = 1, skip_unreached: bool = True,
                    reach: IntactReach | None = None) -> list[NecessityRow]:
    """One row per mutable site and variant (see the module docstring); with
    ``skip_unreached`` False every site runs every variant (no probed pass); ``reach``:
    what the intact runs of ``baseline`` reached, probed as they ran (no probed pass)."""
    mutable = [s for s in sites if s.kind in MUTABLE_KINDS]
    _parse_before_forking(mutable)
    progress = Progress("necessity")
    _STATE.update(run=run, variants=list(variants), sites=mutable, progress=progress, done=0)
    try:
        plans = (_plans(mutable, variants, jobs, reach) if skip_unreached
                 else [list(variants) for _ in mutable])
    except Interrupted:  # Ctrl-C in the probed pass: no site finished
        raise Interrupted([]) from None
    indices = [index for index, plan in enumerate(plans) if plan]  # the sites to run
    planned = [(position, mutable[index], plans[index])
               for position, index in enumerate(indices)]
    _STATE.update(planned=planned)
    progress.phase()
    try:
        ran = dict(zip(indices, forked_map(_one_site, planned, jobs), strict=True))
    except Interrupted as stop:  # Ctrl-C: the rows of the sites whose children answered
        finished = {indices[position]: result for position, result in stop.finished.items()}
        raise Interrupted(_rows(mutable, variants, plans, baseline, finished,
                                only_finished=True)) from None
    progress.done(f"{len(planned)} of {len(mutable)} sites run "
                  f"({sum(len(p) for p in plans)} of {len(mutable) * len(variants)} "
                  "variant runs; the others never reached)")
    return _rows(mutable, variants, plans, baseline, ran)


def _parse_before_forking(sites: Sequence[SyncSite]) -> None:
    """Parse the sites' files here, once: every child finds them parsed
    (:func:`~overlap_harness.engines.core.mutation.parsed`). A file that cannot be read or
    parsed is left for its children to fail on, as before."""
    for file in sorted({site.file for site in sites}):
        try:
            parsed(file)
        except (OSError, SyntaxError):
            continue


def _rows(mutable: Sequence[SyncSite], variants: Sequence[str], plans: list[list[str]],
          baseline: dict[str, VariantOutcome], ran: dict[int, Any],
          only_finished: bool = False) -> list[NecessityRow]:
    """The table's rows from the sites' results ``ran`` (by site index); with
    ``only_finished``, only the sites that have a result or needed no run (an interrupted
    table)."""
    rows = []
    for index, (site, plan) in enumerate(zip(mutable, plans, strict=True)):
        if only_finished and plan and index not in ran:
            continue
        outcomes, reached, error = ran.get(index, ([], {}, None))
        for variant in variants:
            if variant not in plan:  # never reached: the mutated run is the intact run
                rows.append(_row(site, variant, baseline[variant], baseline[variant], 0, None))
                continue
            rows.append(_row(site, variant, baseline[variant],
                             outcomes[plan.index(variant)] if outcomes else None,
                             reached.get(f"{variant}:{site.key}", 0), error))
    return rows


def _row(site: SyncSite, variant: str, base: VariantOutcome, mutated: VariantOutcome | None,
         reached: int, error: str | None) -> NecessityRow:
    where = f"{shown_file(site.file)}:{site.line}"
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


def _innermost_frame(exc: BaseException) -> str:
    """`` at FILE:LINE in FUNCTION``: the innermost frame of ``exc``'s traceback outside this
    package (its file named as race records name it, :func:`.results.shown_file`), or
    nothing."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}engines{os.sep}core{os.sep}" not in f.filename]
    return (f" at {shown_file(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name}"
            if frames else "")


def format_error(exc: BaseException) -> str:
    """The message of a crash and the innermost frame outside this package (the engine's
    line that made the unplanned call, and its function), on one line. An exception raised
    while handling another (an engine that wraps what failed in its own message: SGLang's
    "Capture cuda graph failed") also names where the first one was raised, which is where
    the fault is."""
    text = f"{type(exc).__name__}: {exc}{_innermost_frame(exc)}"
    origin, seen = exc, {id(exc)}
    while True:
        nested = origin.__cause__ or (None if origin.__suppress_context__
                                      else origin.__context__)
        if nested is None or id(nested) in seen:
            break
        origin = nested
        seen.add(id(origin))
    if origin is not exc:
        text += f" (raised while handling {type(origin).__name__}{_innermost_frame(origin)})"
    return text


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
    try:
        _fork_all(function, pending, running, results, jobs)
    except KeyboardInterrupt:  # Ctrl-C: the children end now, what answered goes up
        stop_children(running)
        for _index, read_end in running.values():
            os.close(read_end)
        raise Interrupted(dict(results)) from None
    finally:
        gc.unfreeze()  # the parent's objects collectable again (see _fork_all)
    return [results[i] for i in range(len(items))]


def _fork_all(function: Callable[[Any], T], pending: list[tuple[int, Any]],
              running: dict[int, tuple[int, int]], results: dict[int, T], jobs: int) -> None:
    """:func:`forked_map`'s loop: fork while fewer than ``jobs`` run, collect in order."""
    while pending or running:
        while pending and len(running) < max(1, jobs):
            index, item = pending.pop(0)
            _STATE["done"] = len(results)  # what a child's progress line counts as done
            read_end, write_end = os.pipe()
            # Ctrl-C held back from the fork until the child is in ``running``: one that came
            # between them left a child nobody stopped (holding the command's stdout open)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            # the parent's objects out of the child's garbage collections: a full one walks
            # every object the engine's import made (SGLang: 2 million, 0.9 CPU s) and writes
            # to each, copying the parent's memory page by page into the child
            gc.freeze()
            pid = os.fork()
            if pid == 0:  # the child: run, answer, exit without cleanup of the parent's state
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                os.close(read_end)
                status = 0
                try:
                    payload = pickle.dumps(function(item))
                    with os.fdopen(write_end, "wb") as pipe:
                        pipe.write(payload)
                except KeyboardInterrupt:  # Ctrl-C reached the child too: say so
                    status = INTERRUPTED_STATUS
                finally:
                    os._exit(status)
            os.close(write_end)
            running[pid] = (index, read_end)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C held back: now
        pid = next(iter(running))
        index, read_end = running[pid]
        with os.fdopen(read_end, "rb", closefd=False) as pipe:
            data = pipe.read()
        del running[pid]
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        if not data and os.waitstatus_to_exitcode(status) == INTERRUPTED_STATUS:
            raise KeyboardInterrupt  # the child's Ctrl-C came before this process's
        if not data:
            raise RuntimeError(f"the child for item {index} died without a result")
        results[index] = pickle.loads(data)
