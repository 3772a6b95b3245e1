"""Host threads: every Python thread's CUDA work, each thread a host agent of its own.

STREAM-SEMANTICS.md ("host threads"): a thread has its own program order and its own current
stream; threads are ordered to each other only by host synchronization. torch's dispatch and
function modes are per thread, so a thread started while a watch runs enters the watch's modes
itself (``Thread._bootstrap_inner`` is wrapped: the method every thread, subclass or not, runs
first). Its host agent (:meth:`model.detector.HBDetector.add_host`, named ``thread NAME``) is
registered at its first CUDA action, so threads that do no CUDA work cost no agent.

Happens-before between threads. What a thread hands over is its *capture*: its host agent's
latest node and the joins it inherited and has not yet fed; the receiving thread inherits it,
and feeds it as one host node (named after the synchronization) before its next action. The
hand-overs:

- ``Thread.start`` (the parent's past -> the child) and ``Thread.join`` (the whole thread ->
  the joiner, once it has ended);
- ``queue.Queue`` / ``LifoQueue`` / ``PriorityQueue``: ``put`` -> the ``get`` that returns that
  item (captures travel beside the items, in the queue's own order);
- ``threading.Event``: every ``set`` since the last ``clear`` -> a ``wait`` that returns True;
- ``threading.Lock`` / ``RLock`` made by the program during the watch: ``release`` -> the next
  ``acquire``;
- ``ThreadPoolExecutor.submit`` -> the task, and the task -> ``Future.result()``.

Not modelled, so not an ordering (a hand-over through them reports the races it would hide):
locks made before the watch or by the standard library, ``Condition`` notifications beyond
their lock, ``queue.SimpleQueue``, and any other channel. Threads torch starts in C++ (the
autograd engine's device threads, which inherit the modes) work for the host that waits on
them and count as it. Refused: CUDA work of a Python thread that was already running when the
watch began, two threads issuing to one stream with no host
synchronization between their issues, a thread past the detector's agent limit.
"""

from __future__ import annotations

import _thread
import collections
import concurrent.futures
import contextlib
import os
import queue
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.model.detector import HOST_AGENT, MAX_AGENTS
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.trace import OpId, OpKind
from overlap_harness.recorder.core import Recording
from overlap_harness.recorder.patching import Patch
from overlap_harness.recorder.sites import is_user_file
from overlap_harness.recorder.unmodelled import RecorderError, refuse


@dataclass(frozen=True, slots=True)
class Capture:
    """What a thread hands over: host nodes to join, and per stream how many of its nodes'
    issues it knows (a later issue to that stream comes after them in the stream's order)."""

    ops: tuple[OpId, ...] = ()
    issues: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)
class _ThreadState:
    """One thread's host agent (None until its first CUDA action), inherited joins and the
    stream issues it knows of."""

    name: str
    agent: int | None = None
    pending: list[OpId] = field(default_factory=list)
    label: str = ""  # the synchronization that brought ``pending``
    issues: dict[int, int] = field(default_factory=dict)  # stream agent -> issues known


class HostThreads:
    """The host agents of a recording's threads, and what they hand to each other."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self._main = threading.get_ident()  # the thread that entered the watch
        self._states: dict[int, _ThreadState] = {self._main: _ThreadState("main", HOST_AGENT)}
        self._feeding = False
        self._issued: dict[int, int] = {}  # stream agent -> nodes issued to it
        recording.stream_issued = self.issue

    # -- agents ----------------------------------------------------------------------------
    def host(self) -> int:
        """The calling thread's host agent (:attr:`Recording.issuing`): registered at its
        first use; inherited joins fed first as one host node."""
        state = self._states.get(threading.get_ident())
        if state is None:
            thread = threading.current_thread()
            if isinstance(thread, threading._DummyThread):  # a C++ thread of torch's (an
                return HOST_AGENT  # autograd device thread) works for the waiting host
            refuse(self.recording,
                   f"CUDA work of thread {thread.name!r}, started before the watch",
                   "start the thread inside the watched block")
        if state.agent is None:
            try:
                state.agent = self.recording.detector.add_host(f"thread {state.name}")
            except DeviceUsageError:
                refuse(self.recording,
                       f"thread {state.name!r} (more host threads and streams than the "
                       f"detector's {MAX_AGENTS} agents)", "let fewer threads issue CUDA work")
        if state.pending and not self._feeding:
            joins, state.pending = state.pending, []
            self._feeding = True
            try:
                self.recording.detector.issuer = state.agent
                self.recording.op(state.label or "thread sync", HOST_AGENT, (),
                                  OpKind.HOST_SYNC, joins)
            finally:
                self._feeding = False
        return state.agent

    def issue(self, stream: int) -> None:
        """The calling thread issues a node to ``stream``: refused when another thread issued
        to it without this one knowing (their order on the stream would depend on timing)."""
        state = self._states.get(threading.get_ident())
        issued = self._issued.get(stream, 0)
        if state is None:
            return
        if state.issues.get(stream, 0) < issued:
            name = self.recording.detector.agent_names[stream]
            refuse(self.recording,
                   f"stream {name!r} used by two threads with no host synchronization between "
                   "their issues (their order on it depends on timing)",
                   "hand the stream over through a queue, an event, a lock or a join")
        self._issued[stream] = state.issues[stream] = issued + 1

    def capture(self) -> Capture:
        """What the calling thread hands over now: its latest host node, pending joins and
        the stream issues it knows of."""
        with self.recording._lock:
            state = self._states.get(threading.get_ident())
            if state is None:
                return Capture()
            last = None if state.agent is None else self.recording.detector.last_op(state.agent)
            return Capture((*state.pending, *(() if last is None else (last,))),
                           tuple(state.issues.items()))

    def inherit(self, capture: Capture, label: str) -> None:
        """The calling thread is ordered after ``capture`` (its joins fed before its next
        action)."""
        if not (capture.ops or capture.issues):
            return
        with self.recording._lock:
            state = self._states.get(threading.get_ident())
            if state is not None:  # its own nodes (a Thread.start's _started event) add nothing
                agents = self.recording.detector.node_agent
                own = tuple(op for op in capture.ops if agents[op] != state.agent)
                _merge(state, Capture(own, capture.issues), label)

    def adopt(self, name: str, capture: Capture) -> None:
        """The calling thread starts now, ordered after its parent's ``capture``."""
        with self.recording._lock:
            state = _ThreadState(name)
            _merge(state, capture, "Thread.start")
            self._states[threading.get_ident()] = state

    def leave(self) -> None:
        """The calling thread ends (its ident may be reused by a later thread)."""
        with self.recording._lock:
            self._states.pop(threading.get_ident(), None)


def _merge(state: _ThreadState, capture: Capture, label: str) -> None:
    if capture.ops:
        state.pending.extend(capture.ops)
        state.label = label
    for stream, known in capture.issues:
        if state.issues.get(stream, 0) < known:
            state.issues[stream] = known


def thread_patches(threads: HostThreads, modes: Callable[[], AbstractContextManager[Any]],
                   live: Callable[[], bool]) -> list[Patch]:
    """The patches that carry the watch into new threads and record their hand-overs.

    Args:
        threads: the recording's host threads.
        modes: enters the watch's torch modes in the calling thread.
        live: False once the watch ended (threads still running stop recording).
    """
    thread_cls = threading.Thread
    start, bootstrap, join = thread_cls.start, thread_cls._bootstrap_inner, thread_cls.join

    def started(thread: threading.Thread) -> None:
        thread._overlap_start = threads.capture()  # type: ignore[attr-defined]
        start(thread)

    def bootstrapped(thread: threading.Thread) -> None:
        capture = getattr(thread, "_overlap_start", None)
        if capture is None or not live():
            bootstrap(thread)
            return
        threads.adopt(thread.name, capture)
        run = thread.run

        def run_keeping_refusals() -> None:  # a refusal is kept and reported once, in one line
            with contextlib.suppress(RecorderError):
                run()
        thread.run = run_keeping_refusals  # type: ignore[method-assign]
        try:
            with modes():
                bootstrap(thread)
        finally:
            thread._overlap_end = threads.capture()  # type: ignore[attr-defined]
            threads.leave()

    def joined(thread: threading.Thread, timeout: float | None = None) -> None:
        join(thread, timeout)
        end = getattr(thread, "_overlap_end", None)
        if end is not None and not thread.is_alive():
            threads.inherit(end, f"join {thread.name}")

    patches: list[Patch] = [(thread_cls, "start", started),
                            (thread_cls, "_bootstrap_inner", bootstrapped),
                            (thread_cls, "join", joined)]
    patches += _queue_patches(threads) + _event_patches(threads)
    patches += _lock_patches(threads) + _executor_patches(threads)
    return patches


def _queue_patches(threads: HostThreads) -> list[Patch]:
    """Captures travel beside a queue's items: FIFO, LIFO, or by item for a priority queue
    (``_put`` / ``_get`` run under the queue's own lock)."""
    sides: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def wrap(cls: type, take: Callable[[Any, Any], Capture]) -> list[Patch]:
        put, get = vars(cls)["_put"], vars(cls)["_get"]

        def put_with(q: Any, item: Any) -> None:
            put(q, item)
            side = sides.setdefault(q, collections.defaultdict(collections.deque)
                                    if cls is queue.PriorityQueue else collections.deque())
            if cls is queue.PriorityQueue:
                side[id(item)].append(threads.capture())
            else:
                side.append(threads.capture())

        def get_with(q: Any) -> Any:
            item = get(q)
            side = sides.get(q)
            if side:
                threads.inherit(take(side, item), f"{cls.__name__}.get")
            return item
        return [(cls, "_put", put_with), (cls, "_get", get_with)]

    def by_item(side: Any, item: Any) -> Capture:
        captures = side.get(id(item))
        return captures.popleft() if captures else Capture()
    return (wrap(queue.Queue, lambda side, item: side.popleft())
            + wrap(queue.LifoQueue, lambda side, item: side.pop())
            + wrap(queue.PriorityQueue, by_item))


def _event_patches(threads: HostThreads) -> list[Patch]:
    """Every ``set`` since the last ``clear`` orders a ``wait`` that returns True."""
    sets: weakref.WeakKeyDictionary[threading.Event, list[Capture]] = weakref.WeakKeyDictionary()
    event_cls = threading.Event
    set_, clear, wait = event_cls.set, event_cls.clear, event_cls.wait

    def set_with(event: threading.Event) -> None:
        sets.setdefault(event, []).append(threads.capture())
        set_(event)

    def clear_with(event: threading.Event) -> None:
        clear(event)
        sets.pop(event, None)

    def wait_with(event: threading.Event, timeout: float | None = None) -> bool:
        done = wait(event, timeout)
        if done:
            for capture in list(sets.get(event, ())):
                threads.inherit(capture, "Event.wait")
        return done
    return [(event_cls, "set", set_with), (event_cls, "clear", clear_with),
            (event_cls, "wait", wait_with)]


class _HandOverLock:
    """A ``threading.Lock`` (or ``RLock``) the program made while watched: ``release`` hands
    the releasing thread's capture to the next ``acquire``."""

    def __init__(self, inner: Any, threads: HostThreads) -> None:
        self._inner = inner
        self._threads = threads
        self._released = Capture()
        for name in ("_release_save", "_acquire_restore", "_is_owned", "_at_fork_reinit"):
            if hasattr(inner, name):  # RLock's Condition protocol, forwarded
                setattr(self, name, getattr(inner, name))

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock; the thread is ordered after the last release."""
        got = self._inner.acquire(blocking, timeout)
        if got:
            self._threads.inherit(self._released, "Lock.acquire")
        return got

    def release(self) -> None:
        """Release the lock, handing over what this thread did so far."""
        self._released = self._threads.capture()
        self._inner.release()

    def locked(self) -> bool:
        """Whether the lock is held."""
        return self._inner.locked()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<{self._inner!r} watched for hand-overs>"


_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _lock_patches(threads: HostThreads) -> list[Patch]:
    """``threading.Lock()`` / ``RLock()`` called from the program's own code make locks that
    hand over; the standard library's own (a queue's mutex, a ``Condition``'s waiters) stay
    plain, not an ordering: their hand-overs are modelled where they mean one (queue items,
    events)."""
    def factory(original: Callable[[], Any]) -> Callable[[], Any]:
        def make() -> Any:
            caller = sys._getframe(1).f_code.co_filename
            if is_user_file(caller) and not caller.startswith(_STDLIB):
                return _HandOverLock(original(), threads)
            return original()
        return make
    return [(threading, "Lock", factory(_thread.allocate_lock)),
            (threading, "RLock", factory(threading.RLock))]


def _executor_patches(threads: HostThreads) -> list[Patch]:
    """``ThreadPoolExecutor.submit``: the submitter's past -> the task; the task ->
    ``Future.result()`` (and ``exception()``)."""
    pool_cls, future_cls = concurrent.futures.ThreadPoolExecutor, concurrent.futures.Future
    submit, result, exception = pool_cls.submit, future_cls.result, future_cls.exception

    def submitted(pool: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        handed = threads.capture()
        ended: list[Capture] = []

        def task(*a: Any, **k: Any) -> Any:
            threads.inherit(handed, "submit")
            try:
                return fn(*a, **k)
            finally:
                ended.append(threads.capture())
        future = submit(pool, task, *args, **kwargs)
        future._overlap_end = ended
        return future

    def after(original: Callable[..., Any], label: str) -> Callable[..., Any]:
        def call(future: Any, timeout: float | None = None) -> Any:
            value = original(future, timeout)
            for capture in getattr(future, "_overlap_end", ()):
                threads.inherit(capture, label)
            return value
        return call
    return [(pool_cls, "submit", submitted), (future_cls, "result", after(result, "result")),
            (future_cls, "exception", after(exception, "exception"))]


@contextmanager
def entered(*modes: AbstractContextManager[Any]) -> Iterator[None]:
    """Enter ``modes`` in order in the calling thread; exit them in reverse."""
    stack = list(modes)
    for index, mode in enumerate(stack):
        try:
            mode.__enter__()
        except BaseException:
            for done in reversed(stack[:index]):
                done.__exit__(None, None, None)
            raise
    try:
        yield
    finally:
        for mode in reversed(stack):
            mode.__exit__(None, None, None)

