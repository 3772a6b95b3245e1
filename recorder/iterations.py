"""Iteration marks: which pass of which loop of the user's code issued an op.

A loop's iteration is its header line and how many times the loop has gone round since the
program last entered it (0 for the first pass), found without changing the program: while a
watch runs, a line tracer (``sys.settrace``) follows only the user's frames whose code holds a
``for`` or ``while`` statement, and counts each loop's header line. Entering the header from
outside the loop's body starts the count at 0; arriving at it from inside the body (the jump
back, a ``continue``) is the next pass. Frames of torch, of the standard library and of the
recorder are not traced, and the recorder's own dispatch work runs with the tracer off (on
Python 3.11 any trace function slows every frame; :func:`untraced`), so the cost is one
callback per line of the user's looping code. Marks are read off the stack when an op is
recorded: each user frame that is inside a loop adds that loop's pass, outermost first.

A loop that was already running when the watch began is counted from the watch's start.
When another tracer is installed (a debugger, coverage), the recorder leaves it alone and
counts nothing; ``iteration(i)`` marks still work.

A program may name its iterations itself: ``w.iteration(i)`` on the :class:`~recorder.Watch`
(or :func:`recorder.iteration` from code a ``check_script`` runs) marks every op issued after
it, until the next call, with ``i``; a named mark is shown instead of the counted one.
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any, TypeVar

from overlap_harness.recorder.sites import (
    SourceBusy,
    display_path,
    is_user_file,
    plumbing_version,
    source_tree,
)

_TOGGLES = sys.version_info < (3, 12)  # from 3.12 an idle tracer costs only its calls, and
# switching it off and on re-instruments every code object: worth it only on 3.11


@dataclass(frozen=True, slots=True)
class LoopPass:
    """One loop's pass: the loop's header ``file:line`` and its 0-based count."""

    file: str
    line: int
    count: int

    def describe(self, near_file: str | None = None) -> str:
        """``iteration 3 of the loop at line 18`` (the file named when not ``near_file``)."""
        where = f"line {self.line}" if self.file == near_file else f"{self.file}:{self.line}"
        return f"iteration {self.count} of the loop at {where}"


@dataclass(frozen=True, slots=True)
class IterationMark:
    """Where in the program's loops an op was issued: counted passes, and the program's own
    name for the iteration (``iteration(i)``) when it gave one."""

    loops: tuple[LoopPass, ...] = ()  # outermost first
    named: int | str | None = None

    def describe(self, near_file: str | None = None) -> str:
        """``iteration 3`` when named, else each loop's pass, outermost first."""
        if self.named is not None:
            return f"iteration {self.named}"
        return ", ".join(p.describe(near_file) for p in self.loops)

    def as_json(self) -> dict[str, Any]:
        """``{"named": ..., "loops": [{"file", "line", "count"}, ...]}``."""
        return {"named": self.named,
                "loops": [{"file": p.file, "line": p.line, "count": p.count}
                          for p in self.loops]}


@dataclass(frozen=True, slots=True)
class _Loop:
    """A loop statement's lines: its header, and the first and last line of its body."""

    header: int
    body_first: int
    body_last: int

    def holds(self, line: int) -> bool:
        """``line`` is the header or in the body (where an op is inside this loop)."""
        return self.header <= line <= self.body_last


@dataclass(frozen=True, slots=True)
class _CodeLoops:
    """The loops of one code object: by header line, and the first body lines of the
    ``while True`` loops (where a jump back may land without passing the header)."""

    file: str
    headers: dict[int, _Loop]
    endless_tops: dict[int, _Loop]


@functools.lru_cache(maxsize=4096)  # small values; a file's tree is source_tree's
def _file_loops(filename: str) -> tuple[tuple[_Loop, bool], ...]:
    """Every loop statement of a source file, with whether its test is a constant.

    Raises:
        SourceBusy: the file could not be parsed now (see :func:`recorder.sites.source_tree`).
    """
    tree = source_tree(filename)
    if tree is None:
        return ()
    loops = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.AsyncFor | ast.While) and node.body:
            last = max(n.end_lineno or n.lineno for n in node.body)
            endless = isinstance(node, ast.While) and isinstance(node.test, ast.Constant)
            loops.append((_Loop(node.lineno, node.body[0].lineno, last), endless))
    return tuple(loops)


#: a physical line that may be a loop's header: a ``for`` or ``while`` statement always
#: begins its line (no compound statement may follow ``;`` or another's ``:``)
_HEADER_START = re.compile(r"[ \t\f]*(?:async[ \t]+)?(?:for|while)\b")


def _may_head_a_loop(filename: str, lines: set[int]) -> bool:
    """Whether one of ``lines`` of ``filename`` may be a loop's header, from the text of
    those lines alone (true also for a line that only looks like one: a comprehension's
    ``for`` on a line of its own). Most code an engine's loop calls has no loop: its file
    need not be parsed (SGLang's loop: 878 files parsed, 15 CPU s, before this test)."""
    text = linecache.getlines(filename)
    return any(0 < line <= len(text) and _HEADER_START.match(text[line - 1])
               for line in lines)


class _FrameLoops:
    """The local tracer of one frame: counts its loops' passes from line events. While the
    frame runs it is on its thread's stack of looping frames (``running``)."""

    __slots__ = ("_cache", "code", "counts", "last_line", "running")

    def __init__(self, code: _CodeLoops, running: list[_FrameLoops],
                 line: int | None = None) -> None:
        self.code = code
        self.running = running
        self.counts: dict[int, int] = {}
        self.last_line = line
        self._cache: tuple[int | None, tuple[LoopPass, ...]] | None = None
        if line is not None:  # a frame already inside its loops: counted from now
            for loop in code.headers.values():
                if loop.holds(line):
                    self.counts[loop.header] = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> _FrameLoops:
        if event == "line":
            line = frame.f_lineno
            loop = self.code.headers.get(line)
            if loop is None:
                loop = self.code.endless_tops.get(line)
                if loop is not None and not self._from_body(loop):
                    loop = None  # the first pass's first line: counted at the header
                if loop is not None:
                    self.counts[loop.header] = self.counts.get(loop.header, -1) + 1
                    self._cache = None
            else:
                if self._from_body(loop) and loop.header in self.counts:
                    self.counts[loop.header] += 1
                else:
                    self.counts[loop.header] = 0
                self._cache = None
            self.last_line = line
        elif event == "return":  # also a generator's yield; its resumption is a call again
            running = self.running
            if running and running[-1] is self:
                running.pop()
            elif self in running:
                running.remove(self)
        return self

    def _from_body(self, loop: _Loop) -> bool:
        last = self.last_line
        return last is not None and loop.body_first <= last <= loop.body_last

    def passes(self) -> tuple[LoopPass, ...]:
        """The passes of this frame's loops that hold its current line, outermost first."""
        line = self.last_line
        cache = self._cache
        if cache is not None and cache[0] == line:
            return cache[1]
        found = () if line is None else tuple(sorted(
            (LoopPass(self.code.file, header, count) for header, count in self.counts.items()
             if self.code.headers[header].holds(line)), key=lambda p: p.line))
        self._cache = (line, found)
        return found


class _SeenCodes:
    """The loops of every code object any watch has looked at (:meth:`_GlobalTracer.
    code_loops`), kept from one watch to the next: a code object's file and lines never
    change, and working them out (the file's loops, the code's lines) for each of the
    thousands of functions an engine's loop calls cost every run as much again (SGLang's
    necessity table: 9% of its CPU). Weak, so code that is dropped (a script ``check`` ran)
    is not kept; forgotten when a file is declared plumbing since (:func:`recorder.sites.
    not_user_code`), which changes whose code a frame is."""

    def __init__(self) -> None:
        # by code, with its file: equal code objects of two files (the same function at the
        # same line) compare equal, and each file has its own loops
        self._loops: weakref.WeakKeyDictionary[CodeType, tuple[str, _CodeLoops | None]] = \
            weakref.WeakKeyDictionary()
        self._version = plumbing_version()

    def get(self, code: CodeType) -> _CodeLoops | bool | None:
        """The loops known for ``code`` (None: it has none), or False when not known."""
        if self._version != plumbing_version():
            self._loops.clear()
            self._version = plumbing_version()
        file, loops = self._loops.get(code, ("", False))
        return loops if file == code.co_filename else False

    def put(self, code: CodeType, loops: _CodeLoops | None) -> None:
        """Remember ``code``'s loops (None: none)."""
        self._loops[code] = (code.co_filename, loops)


_SEEN_CODES = _SeenCodes()


class _GlobalTracer:
    """The thread's trace function: a :class:`_FrameLoops` for the user's looping frames,
    pushed on the thread's stack of running looping frames."""

    def __init__(self) -> None:
        self._codes: dict[CodeType, _CodeLoops | None] = {}  # this watch's (a dict: fastest)
        self._threads = threading.local()

    def running(self) -> list[_FrameLoops]:
        """This thread's looping frames now running, outermost first."""
        try:
            return self._threads.running  # type: ignore[no-any-return]
        except AttributeError:
            self._threads.running = []
            return self._threads.running  # type: ignore[no-any-return]

    def code_loops(self, code: CodeType) -> _CodeLoops | None:
        """The loops of ``code`` when it is the user's and has any (cached)."""
        try:
            return self._codes[code]
        except KeyError:
            pass
        known = _SEEN_CODES.get(code)
        if known is not False:
            self._codes[code] = known  # type: ignore[assignment]
            return known  # type: ignore[return-value]
        found = None
        lines = {line for _start, _end, line in code.co_lines() if line is not None}
        if is_user_file(code.co_filename) and _may_head_a_loop(code.co_filename, lines):
            try:
                loops = _file_loops(code.co_filename)
            except SourceBusy:  # called back inside a parse: this frame goes uncounted
                return None
            mine = [(loop, endless) for loop, endless in loops if loop.header in lines]
            if mine:
                found = _CodeLoops(display_path(code.co_filename),
                                   {loop.header: loop for loop, _ in mine},
                                   {loop.body_first: loop for loop, endless in mine
                                    if endless and loop.body_first != loop.header})
        self._codes[code] = found
        _SEEN_CODES.put(code, found)
        return found

    def __call__(self, frame: FrameType, event: str, arg: Any) -> _FrameLoops | None:
        if event != "call":
            return None
        local = frame.f_trace
        running = self.running()
        if type(local) is _FrameLoops:  # a resumed generator keeps its counts
            local.running = running  # (resumed maybe by another thread)
        else:
            code = self.code_loops(frame.f_code)
            if code is None:
                return None
            local = _FrameLoops(code, running)
        running.append(local)
        return local


_counting_off = [0]  # > 0 inside loops_not_counted()


@contextmanager
def loops_not_counted() -> Iterator[None]:
    """Inside, a watch counts no loop passes: its ops carry only the iterations the program
    names (``iteration(i)``). For runs whose races alone are read, never their marks (the
    necessity table's runs of a mutated engine, whose race records hold the named iteration
    only): the line tracer costs every frame on Python 3.11 (SGLang's necessity table: 12%
    of its CPU in the tracer's calls)."""
    _counting_off[0] += 1
    try:
        yield
    finally:
        _counting_off[0] -= 1


class LoopCounter:
    """Counts the user's loop passes while entered (see the module docstring)."""

    def __init__(self) -> None:
        self.tracer = _GlobalTracer()
        self.active = False

    @contextmanager
    def counting(self) -> Iterator[LoopCounter]:
        """Trace the user's looping frames inside (this thread, and threads started inside);
        nothing when another trace function is installed, or inside
        :func:`loops_not_counted`."""
        if sys.gettrace() is not None or _counting_off[0]:
            yield self
            return
        previous_threads = threading.gettrace()
        self._adopt_running_frames(sys._getframe(1))
        sys.settrace(self.tracer)
        threading.settrace(self.tracer)
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            threading.settrace(previous_threads)  # type: ignore[arg-type]
            if sys.gettrace() is self.tracer:
                sys.settrace(None)
            frame: FrameType | None = sys._getframe(1)
            while frame is not None:  # no stale counts for a later watch in these frames
                if type(frame.f_trace) is _FrameLoops:
                    frame.f_trace = None
                frame = frame.f_back
            self.tracer.running().clear()

    def _adopt_running_frames(self, frame: FrameType | None) -> None:
        """Trace the user's frames already running (a watch entered inside a loop)."""
        running = self.tracer.running()
        running.clear()
        adopted = []
        while frame is not None:
            code = self.tracer.code_loops(frame.f_code)
            if code is not None and (frame.f_trace is None
                                     or type(frame.f_trace) is _FrameLoops):
                frame.f_trace = _FrameLoops(code, running, frame.f_lineno)
                adopted.append(frame.f_trace)
            frame = frame.f_back
        running.extend(reversed(adopted))

    def passes(self) -> tuple[LoopPass, ...]:
        """The loop passes of this thread's stack now, outermost first (empty outside any
        loop)."""
        if not self.active:
            return ()
        running = self.tracer.running()
        if len(running) == 1:
            return running[0].passes()
        chain: list[LoopPass] = []
        for local in running:
            chain.extend(local.passes())
        return tuple(chain)


class IterationMarks:
    """The marks of one recording's nodes: counted loop passes and the program's names."""

    def __init__(self) -> None:
        self.counter: LoopCounter | None = None  # set while a watch counts loops
        self.named: int | str | None = None
        self.by_op: dict[int, IterationMark] = {}

    def note(self, op: int) -> None:
        """Mark node ``op`` with the iteration the program is in now (if any)."""
        loops = self.counter.passes() if self.counter is not None else ()
        if loops or self.named is not None:
            self.by_op[op] = IterationMark(loops, self.named)

    def of(self, op: int) -> IterationMark | None:
        """The mark of node ``op`` (None: issued outside every loop)."""
        return self.by_op.get(op)


F = TypeVar("F", bound=Callable[..., Any])


def untraced(method: F) -> F:
    """Run ``method`` (the recorder's own per-op work) with the loop tracer off (Python
    3.11: an installed trace function slows every frame, traced or not)."""
    if not _TOGGLES:
        return method

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        tracer = sys.gettrace()
        if type(tracer) is not _GlobalTracer:
            return method(*args, **kwargs)
        sys.settrace(None)
        try:
            return method(*args, **kwargs)
        finally:
            sys.settrace(tracer)
    return run  # type: ignore[return-value]
