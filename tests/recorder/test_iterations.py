"""Iteration marks: the loop counter on plain Python loops (every shape of loop a program
writes), and the marks a watched program's races carry, counted and named."""

from __future__ import annotations

import ast
import contextlib
import sys
import textwrap
import types
from pathlib import Path

import pytest

from overlap_harness.recorder.iterations import (
    LoopCounter,
    LoopPass,
    loops_not_counted,
    untraced,
)
from overlap_harness.recorder.sites import display_path

HERE = display_path(__file__)


def line_of(function: object, text: str) -> int:
    """The line of ``function``'s source that holds ``text``."""
    code = function.__code__  # type: ignore[attr-defined]
    lines = Path(code.co_filename).read_text().splitlines()
    for number in range(code.co_firstlineno, len(lines) + 1):
        if text in lines[number - 1]:
            return number
    raise AssertionError(text)


def counts(seen: list[tuple[LoopPass, ...]]) -> list[tuple[tuple[int, int], ...]]:
    return [tuple((p.line, p.count) for p in passes) for passes in seen]


def test_for_loop_passes_count_from_zero_and_continue_is_the_next_pass() -> None:
    counter = LoopCounter()
    seen = []

    def program() -> None:
        seen.append(counter.passes())  # outside every loop
        for step in range(4):  # the loop
            if step == 1:
                continue
            seen.append(counter.passes())
        seen.append(counter.passes())  # after it

    with counter.counting():
        program()
    loop = line_of(program, "# the loop")
    assert counts(seen) == [(), ((loop, 0),), ((loop, 2),), ((loop, 3),), ()]
    assert all(p.file == HERE for passes in seen for p in passes)


def test_nested_loops_restart_the_inner_count_and_list_outermost_first() -> None:
    counter = LoopCounter()
    seen = []

    def program() -> None:
        for _outer in range(2):  # outer
            for _inner in range(2):  # inner
                seen.append(counter.passes())

    with counter.counting():
        program()
    o, i = line_of(program, "# outer"), line_of(program, "# inner")
    assert counts(seen) == [((o, 0), (i, 0)), ((o, 0), (i, 1)), ((o, 1), (i, 0)),
                            ((o, 1), (i, 1))]


def test_while_loops_multiline_headers_and_one_line_loops() -> None:
    counter = LoopCounter()
    seen = []

    def program() -> None:
        n = 0
        while True:  # endless
            seen.append(counter.passes())
            n += 1
            if n == 2:
                break
        while (n < 4
               and n >= 0):  # two-line test
            seen.append(counter.passes())
            n += 1
        for _ in range(2): seen.append(counter.passes())  # one line  # noqa: E701

    with counter.counting():
        program()
    endless = line_of(program, "# endless")
    test = line_of(program, "while (n < 4")
    one = line_of(program, "# one line")
    assert counts(seen) == [((endless, 0),), ((endless, 1),), ((test, 0),), ((test, 1),),
                            ((one, 0),), ((one, 1),)]


def test_a_helper_called_from_a_loop_is_marked_with_the_callers_loop() -> None:
    counter = LoopCounter()
    seen = []

    def helper() -> None:
        seen.append(counter.passes())

    def program() -> None:
        for _ in range(2):  # caller's loop
            helper()

    with counter.counting():
        program()
    loop = line_of(program, "# caller's loop")
    assert counts(seen) == [((loop, 0),), ((loop, 1),)]


def test_a_generator_keeps_its_count_across_yields_and_exceptions_unwind() -> None:
    counter = LoopCounter()
    seen = []

    def produce():
        for item in range(3):  # producer
            seen.append(counter.passes())
            yield item

    def failing() -> None:
        for _ in range(2):
            raise ValueError

    def program() -> None:
        for _ in produce():
            with contextlib.suppress(ValueError):
                failing()
        seen.append(counter.passes())  # nothing left of the unwound frames

    with counter.counting():
        program()
    loop = line_of(produce, "# producer")
    outer = line_of(program, "for _ in produce")
    assert counts(seen) == [((outer, 0), (loop, 0)), ((outer, 1), (loop, 1)),
                            ((outer, 2), (loop, 2)), ()]


def test_a_thread_started_inside_counts_its_own_loops() -> None:
    import threading

    counter = LoopCounter()
    seen = []

    def worker() -> None:
        for _ in range(2):  # worker loop
            seen.append(counter.passes())

    with counter.counting():
        for _ in range(5):  # main loop: not the worker's
            pass
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    loop = line_of(worker, "# worker loop")
    assert counts(seen) == [((loop, 0),), ((loop, 1),)]


def test_a_loop_running_when_counting_starts_is_counted_from_then() -> None:
    counter = LoopCounter()
    seen = []
    loop = sys._getframe().f_lineno + 1
    for step in range(3):
        if step == 1:
            with counter.counting():
                seen.append(counter.passes())
    assert counts(seen) == [((loop, 0),)]
    assert sys.gettrace() is None or type(sys.gettrace()).__name__ != "_GlobalTracer"


def test_another_tracer_is_left_alone_and_nothing_is_counted() -> None:
    calls = []

    def other(frame, event, arg):  # a debugger's, or coverage's
        calls.append(event)

    previous = sys.gettrace()
    sys.settrace(other)
    try:
        counter = LoopCounter()
        with counter.counting():
            for _ in range(2):
                assert counter.passes() == ()
        assert sys.gettrace() is other
    finally:
        sys.settrace(previous)
    assert calls  # it went on tracing


def test_inside_loops_not_counted_a_watch_counts_nothing_and_sets_no_tracer() -> None:
    counter = LoopCounter()
    seen: list = []
    tracers = []

    def program() -> None:
        tracers.append(sys.gettrace())
        for _ in range(2):  # the loop
            seen.append(counter.passes())

    with loops_not_counted(), counter.counting():
        program()
    assert seen == [(), ()]
    assert tracers[0] is None or type(tracers[0]).__name__ != "_GlobalTracer"
    with counter.counting():  # counted again after the block
        program()
    loop = line_of(program, "# the loop")
    assert counts(seen[2:]) == [((loop, 0),), ((loop, 1),)]


def test_a_parse_asked_for_inside_another_is_refused_and_not_cached(tmp_path: Path) -> None:
    """Python 3.11 breaks a parse that another parse interrupts (a finalizer or trace
    callback inside ``ast.parse``: 'AST constructor recursion depth mismatch'), so the
    recorder's own parses never nest: the inner one is refused, and made when asked again."""
    from overlap_harness.recorder import sites

    path = tmp_path / "program.py"
    path.write_text("for step in range(2):\n    pass\n")
    sites._parsing[0] = True  # as inside another parse
    try:
        with pytest.raises(sites.SourceBusy):
            sites.source_tree(str(path))
    finally:
        sites._parsing[0] = False
    assert isinstance(sites.source_tree(str(path)).body[0], ast.For)


def test_a_later_watch_reuses_the_loops_found_for_a_code_and_counts_the_same(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What a code object's loops are is worked out once per process, not once per watch;
    declaring a file plumbing since makes it worked out again."""
    from overlap_harness.recorder import iterations, sites

    def program(counter: LoopCounter, seen: list) -> None:
        for _ in range(2):  # the loop
            seen.append(counter.passes())

    first: list = []
    counter = LoopCounter()
    with counter.counting():
        program(counter, first)
    looked_up = []
    real = iterations._file_loops
    monkeypatch.setattr(iterations, "_file_loops",
                        lambda name: looked_up.append(name) or real(name))
    second: list = []
    counter = LoopCounter()
    with counter.counting():
        program(counter, second)
    loop = line_of(program, "# the loop")
    assert counts(first) == counts(second) == [((loop, 0),), ((loop, 1),)]
    assert __file__ not in looked_up  # known from the first watch
    sites.not_user_code(str(tmp_path / "stand_in.py"))  # another file is plumbing now
    third: list = []
    counter = LoopCounter()
    with counter.counting():
        program(counter, third)
    assert counts(third) == counts(first)
    assert __file__ in looked_up  # worked out again


TRICKY_LOOPS = textwrap.dedent("""\
    def comprehension_line(items):
        return [x
                for x in items]  # a comprehension's for on a line of its own


    def no_space(total):
        while(total):
            total.pop()


    def tab(items):
        for\tx in items: pass


    def exits_at_once():
        while True:
            return 1


    async def asynchronous(stream):
        async for item in stream:
            yield item


    def in_a_string(items):
        text = \"\"\"
    for this line is in a string
    \"\"\"
        return text, {k: v for k, v in items}
    """)


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    found = [code]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found += _code_objects(constant)
    return found


def test_the_loops_found_for_each_code_object_are_its_loop_statements(tmp_path: Path) -> None:
    """Oracle: the file's for/while statements (its syntax tree) whose header line is one of
    the code object's lines. The tracer finds the same, though it parses only the files
    whose code may hold a loop."""
    import json.decoder
    import threading as threading_module

    from overlap_harness.recorder.iterations import _GlobalTracer

    tricky = tmp_path / "tricky_loops.py"
    tricky.write_text(TRICKY_LOOPS)
    files = [str(tricky), json.decoder.__file__, threading_module.__file__, __file__]
    checked = 0
    for file in files:
        source = Path(file).read_text()
        headers = {node.lineno for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.For | ast.AsyncFor | ast.While)}
        for code in _code_objects(compile(source, file, "exec")):
            lines = {line for _, _, line in code.co_lines() if line is not None}
            found = _GlobalTracer().code_loops(code)
            assert (set(found.headers) if found else set()) == headers & lines, code
            checked += 1
    assert checked > 100


def test_untraced_work_runs_with_the_tracer_off_and_restores_it() -> None:
    counter = LoopCounter()
    inside = []

    @untraced
    def recorder_work() -> None:
        inside.append(sys.gettrace())

    with counter.counting():
        recorder_work()
        after = sys.gettrace()
    if sys.version_info < (3, 12):
        assert inside == [None]
    assert after is counter.tracer


LOOP_PROGRAM = textwrap.dedent("""\
    import sys
    import torch
    import overlap_harness.recorder as recorder

    side = torch.cuda.Stream()
    data = torch.zeros(8, device="cuda")
    for step in range(3):
        if "--named" in sys.argv:
            recorder.iteration(f"decode-{step}")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            data.add_(1)
        if "--fixed" in sys.argv:
            torch.cuda.current_stream().wait_stream(side)
        data.sum()
    """)


@pytest.fixture
def loop_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "loop.py"
    path.write_text(LOOP_PROGRAM)
    return path


def test_a_racing_loop_is_reported_once_with_its_iterations(loop_program: Path) -> None:
    from overlap_harness.recorder import check_script
    from overlap_harness.recorder.report_text import report_lines

    result = check_script(loop_program, mode="cpu")
    assert report_lines(result) == [
        "RAW race on data (allocated at loop.py:6), elements 0-7 (all 8), 6 times\n"
        "  first:  write by add_ on stream side at loop.py:12, "
        "iterations 0 to 2 of the loop at line 7\n"
        "  second: read by sum on stream default at loop.py:15, "
        "iterations 0 to 2 of the loop at line 7"]
    assert check_script(loop_program, ["--fixed"], mode="cpu").races == []


def test_named_iterations_replace_the_loop_count(loop_program: Path) -> None:
    from overlap_harness.recorder import check_script
    from overlap_harness.recorder.report_text import report_lines

    result = check_script(loop_program, ["--named"], mode="cpu")
    (paragraph,) = report_lines(result)
    assert paragraph.splitlines()[1:] == [
        "  first:  write by add_ on stream side at loop.py:12, "
        "iterations decode-0 to decode-2",
        "  second: read by sum on stream default at loop.py:15, "
        "iterations decode-0 to decode-2"]
    assert check_script(loop_program, ["--named", "--fixed"], mode="cpu").races == []


def test_json_gives_each_sides_first_and_last_iteration(loop_program: Path) -> None:
    import json

    from overlap_harness.cli import main

    assert main(["check", "--cpu", "--json", "races.json", str(loop_program)]) == 1
    (race,) = json.loads(Path("races.json").read_text())["races"]
    loop = {"file": "loop.py", "line": 7}
    assert race["count"] == 6
    assert race["first"]["iterations"] == {
        "first": {"named": None, "loops": [{**loop, "count": 0}]},
        "last": {"named": None, "loops": [{**loop, "count": 2}]}}
    assert main(["check", "--cpu", "--json", "races.json", str(loop_program), "--named"]) == 1
    (race,) = json.loads(Path("races.json").read_text())["races"]
    assert race["second"]["iterations"]["last"] == {
        "named": "decode-2", "loops": [{**loop, "count": 2}]}
    assert main(["check", "--cpu", "--json", "races.json", str(loop_program), "--fixed"]) == 0


def test_watch_iteration_marks_and_no_mark_outside_loops() -> None:
    import torch

    from overlap_harness.recorder import watch

    with watch("cpu") as w:
        side = torch.cuda.Stream()
        data = torch.zeros(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            data.add_(1)
        w.iteration(7)
        data.sum()
    (race,) = w.races
    assert w.mark_of(race.first) is None  # no loop, no name: nothing to say
    assert w.mark_of(race.second).describe() == "iteration 7"
    # the model's text names the iteration the program set, and says nothing before it
    assert "add_ on side" in race.describe() and "sum (iteration 7) on default" in race.describe()
