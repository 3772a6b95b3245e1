"""The processes a suite's runs are shared among, results in spec order.

:func:`in_order` runs a function over specs in this process or in a pool (forked for the
suite's runs: the workers inherit every module loaded and the specs themselves; spawned for
exploration), and hands each result over as it comes, in spec order, so reports can start on
the first runs while later ones simulate. The runner (:mod:`overlap_harness.runner`) decides
what runs; this module only how many processes run it.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator
from typing import Any

from overlap_harness.scenarios.expand import RunSpec

#: In a pool's worker: the function and the specs of its pool (:func:`_adopt_work`).
_pool_work: tuple[Callable[[RunSpec], Any], list[RunSpec]] | None = None


def _adopt_work(fn: Callable[[RunSpec], Any], specs: list[RunSpec]) -> None:
    """Pool initializer: leave SIGINT to the parent process, and keep the pool's function
    and specs, so that a task is an index. A forked worker has them from the parent's
    memory; sent per task, each spec was pickled and unpickled again (its scenario is a tree
    of frozen dataclasses: about 1 ms a spec, 0.1 CPU s of the bundled suite)."""
    global _pool_work
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _pool_work = (fn, specs)


def _work_on(index: int) -> Any:
    """In a pool's worker: its function over spec ``index`` (see :func:`_adopt_work`)."""
    assert _pool_work is not None, "a pool task outside a pool's worker"
    fn, specs = _pool_work
    return fn(specs[index])


def in_order(fn: Callable[[RunSpec], Any], specs: list[RunSpec], jobs: int = 1,
              start: str = "spawn") -> Iterator[Any]:
    """``fn`` over ``specs``, each result as it comes, in spec order (in a ``jobs``-process
    pool of the ``start`` method when > 1). The pool ends with the iterator; closing the
    iterator early (an error or Ctrl-C in the caller) stops the pool at once."""
    if jobs <= 1:
        yield from map(fn, specs)
        return
    # workers ignore Ctrl-C: the parent stops them, with one line, no tracebacks
    pool = multiprocessing.get_context(start).Pool(jobs, _adopt_work, (fn, specs))
    try:
        yield from pool.imap(_work_on, range(len(specs)))
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()


def map_in_order(fn: Callable[[RunSpec], Any], specs: list[RunSpec],
                 progress: Callable[[int, int, str], None] | None, jobs: int = 1,
                 start: str = "spawn") -> list[Any]:
    """``fn`` over ``specs`` in order (in a ``jobs``-process pool of the ``start`` method
    when > 1), with progress."""
    out: list[Any] = []
    results = in_order(fn, specs, jobs, start)
    try:
        for i, spec in enumerate(specs):
            if progress is not None:
                progress(i, len(specs), spec.run_id)
            out.append(next(results))
        next(results, None)  # the end: the pool is closed and joined
    finally:
        results.close()
    if progress is not None:
        progress(len(specs), len(specs), "")
    return out
