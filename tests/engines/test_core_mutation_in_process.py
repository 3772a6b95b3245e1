"""The core's in-process mutation: one statement removed by recompiling its function alone, with
the function's own file and line numbers (no vLLM needed)."""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import pytest

from overlap_harness.engines.core.mutation import MutationError, mutant, removed, site


class Counter:
    def __init__(self) -> None:
        self.log: list[str] = []

    def step(self, value: int) -> int:
        self.log.append("before")
        value += 1
        self.log.append("after")
        return value

    @contextmanager
    def fenced(self):
        self.log.append("fence")
        yield
        self.log.append("record")


class Child(Counter):
    def step(self, value: int) -> int:
        value = super().step(value)
        value *= 10
        return value


def test_the_named_statement_is_removed_and_the_rest_runs():
    target = site(Counter, "step", "value += 1")
    assert target.code == "value += 1" and target.file == inspect.getsourcefile(Counter)
    counter = Counter()
    with removed(target):
        assert counter.step(1) == 1 and counter.log == ["before", "after"]
    assert counter.step(1) == 2  # restored


def test_a_race_site_in_the_mutant_is_the_original_line():
    target = site(Counter, "step", 'self.log.append("after")')
    function = mutant(target)
    lines = {line for _start, _end, line in function.__code__.co_lines() if line}
    assert target.line - 1 in lines and target.line + 1 in lines
    assert function.__code__.co_filename == target.file


def test_decorated_functions_and_super_calls_survive():
    counter = Counter()
    with removed(site(Counter, "fenced", 'self.log.append("fence")')), counter.fenced():
        pass
    assert counter.log == ["record"]
    with removed(site(Child, "step", "value *= 10")):
        assert Child().step(1) == 2


def test_statements_of_one_function_are_removed_together():
    counter = Counter()
    before = site(Counter, "step", 'self.log.append("before")')
    with removed(before, site(Counter, "step", "value += 1")):
        assert counter.step(1) == 1 and counter.log == ["after"]
    with pytest.raises(MutationError, match="not in the function of"):
        mutant(before, site(Child, "step", "value *= 10"))


def test_a_needle_that_is_not_there_is_one_clear_error():
    with pytest.raises(MutationError, match="no line containing 'value -= 1'"):
        site(Counter, "step", "value -= 1")


def test_a_function_from_another_version_of_a_file_keeps_that_files_lines(tmp_path):
    from overlap_harness.engines.core.mutation import function_from_file

    old = tmp_path / "old_counter.py"
    old.write_text("class Counter:\n    def step(self, value):\n        return value + OFFSET\n")
    step = function_from_file(old, "Counter", "step", {"OFFSET": 5})
    assert step(None, 1) == 6
    assert step.__code__.co_filename == str(old) and step.__code__.co_firstlineno == 2
    with pytest.raises(MutationError, match=r"no function Counter\.stop"):
        function_from_file(old, "Counter", "stop", {})
