"""Which inputs an op's function never reads (sim/fn_inputs.py): those get the buffer's live
memory instead of a snapshot. The expectations are written by hand per function; each case
that must keep its copy (the input reached through a closure, ``locals()``, ``*args``, a
callable that is not a plain function) has its twin beside it, and on the device a function
that does reach its input still gets a private copy."""

from __future__ import annotations

import functools

import torch

from overlap_harness.sim.fn_inputs import unread_inputs
from overlap_harness.sim.sim_device import SimDevice

I64 = torch.int64
OUT = torch.zeros(2, dtype=I64)


def reads_through_locals(v):
    return locals()["v"]


def reads_after_reassigning(v):
    v = v + 1
    return v


def reads_in_a_nested_function(v):
    def inner():
        return v

    return inner()


def test_parameters_never_loaded_are_unread() -> None:
    assert unread_inputs(lambda v, out=OUT: out) == (True, False)
    assert unread_inputs(lambda r2t: None) == (True,)
    assert unread_inputs(lambda v, fo: v + 1) == (False, True)
    assert unread_inputs(lambda a, b, c: b) == (True, False, True)


def test_parameters_reached_some_way_count_as_read() -> None:
    assert unread_inputs(lambda v: v) == ()
    assert unread_inputs(lambda v: [v for _ in range(2)]) == ()  # captured by the comprehension
    assert unread_inputs(reads_through_locals) == ()
    assert unread_inputs(reads_after_reassigning) == ()
    assert unread_inputs(reads_in_a_nested_function) == ()
    assert unread_inputs(lambda *inputs: None) == ()  # through *args: not a named parameter
    assert unread_inputs(functools.partial(lambda v, w: None, 1)) == ()  # not a plain function
    assert unread_inputs(torch.neg) == ()


def run_with_a_clobber(fn) -> tuple[list[int], list[int]]:
    """Op "k" (10 us) reads buffer ``a`` and writes ``out`` with ``fn``'s result; op "w" on
    another stream writes ``a`` while k runs. Returns what ``out`` and ``a`` hold at the end."""
    dev = SimDevice(host_launch_us=1.0)
    s, f = dev.stream("s"), dev.stream("f")
    a = dev.buffer("a", (2,), I64, fill=3)
    out = dev.buffer("out", (2,), I64, fill=0)
    dev.launch(s, "k", fn, reads=[a], writes=[out], cost_us=10)
    dev.launch(f, "w", lambda: torch.tensor([7, 7]), writes=[a], cost_us=1)
    dev.finish()
    return dev.value(out).tolist(), dev.value(a).tolist()


def test_an_input_reached_through_locals_is_still_a_private_copy() -> None:
    # were it taken for unread, it would get the live memory: the add_ would change ``a`` and
    # ``out`` would get what w lands ([7, 7])
    def fn(v):
        mine = locals()["v"]
        mine.add_(1)  # its own copy: the buffer keeps 3 until w lands
        return mine  # the copy as of k's start, not what w lands later

    assert run_with_a_clobber(fn) == ([4, 4], [7, 7])
