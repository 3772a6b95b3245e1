"""NumPy host accesses of pinned memory race device copies like torch's do (issue 34).

Each racy program (a non_blocking copy into or out of pinned memory, then a NumPy access of
that memory before the event sync) has its fixed twin (the sync first: race-free). Every
verdict is the detector's. A NumPy path the recorder cannot follow (a raw pointer handed
out) makes the verdict incomplete: ``check`` exits 2 and ``Watch.complete`` is False."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from overlap_harness.cli import main
from overlap_harness.model.trace import RaceKind
from overlap_harness.recorder import watch

N = 6
ORIGINAL_ARRAY = np.array


def _kinds(watcher: Any) -> list[tuple[str, str]]:
    return sorted({(str(r.kind), r.buffer.split("@")[0]) for r in watcher.races})


class _Holder:
    """An object whose attribute holds a plain array (``self.np[:n] = ...``)."""

    np: np.ndarray


def _into_plain(s: np.ndarray, *_: Any) -> np.ndarray:
    plain = np.zeros(8, np.int64)
    plain[:N] = s[:N]  # NumPy copies in C: seen from the statement around ``s[:N]``
    return plain


def _into_plain_attribute(s: np.ndarray, *_: Any) -> np.ndarray:
    holder = _Holder()
    holder.np = np.zeros(8, np.int64)
    holder.np[1:N + 1] = s[:N]
    return holder.np


# Host reads after a D2H into pinned memory: (staging's NumPy view, its tensor, a second
# pinned buffer's NumPy view, a view taken before the copy) -> the read.
READS: dict[str, Callable[..., Any]] = {
    # vLLM 0.17.0's read of #36013's counts: one pinned array into another
    "pinned[:n] = staging[:n]": lambda s, t, other, early: other.__setitem__(
        slice(0, N), s[:N]),
    "plain[:n] = staging[:n]": _into_plain,
    "holder.np[1:n+1] = staging[:n]": _into_plain_attribute,
    "np.array(staging[:n])": lambda s, t, other, early: np.array(s[:N]),
    "np.copyto(plain, staging)": lambda s, t, other, early: np.copyto(np.zeros(8, np.int64), s),
    "tobytes": lambda s, t, other, early: s[:N].tobytes(),
    "iteration": lambda s, t, other, early: [int(v) for v in s[:N]],
    "sum": lambda s, t, other, early: s[:N].sum(),
    "np.max": lambda s, t, other, early: np.max(s[:N]),
    "memory viewed before the copy": lambda s, t, other, early: early.tolist(),
    "torch.from_numpy": lambda s, t, other, early: torch.from_numpy(s[:N]).sum().item(),
    "plain[:n] = staging tensor": lambda s, t, other, early: np.zeros(8, np.int64).__setitem__(
        slice(0, N), t[:N]),
}


def _read_after_d2h(read: Callable[..., Any], synchronize: bool,
                    mode: str = "cpu") -> list[tuple[str, str]]:
    with watch(mode) as w:
        x = torch.arange(8, device="cuda")
        staging = torch.zeros(8, dtype=torch.int64, pin_memory=True)
        other = torch.zeros(8, dtype=torch.int64, pin_memory=True).numpy()
        early = np.asarray(staging[:N])  # a view: reading it later is the access
        done = torch.cuda.Event()
        staging[:N].copy_(x[:N], non_blocking=True)
        done.record()
        if synchronize:
            done.synchronize()
        read(staging.numpy(), staging, other, early)
        if mode == "gpu":
            torch.cuda.synchronize()
    return _kinds(w)


@pytest.mark.parametrize("name", sorted(READS))
def test_numpy_read_before_the_sync_races_and_its_twin_does_not(name):
    assert _read_after_d2h(READS[name], synchronize=False) == [
        (str(RaceKind.HOST_D2H), "staging")]
    assert _read_after_d2h(READS[name], synchronize=True) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(READS))
def test_gpu_mode_sees_the_same_numpy_reads(name):
    """GPU mode: ``.numpy()`` of real pinned memory is the same recorded view."""
    assert _read_after_d2h(READS[name], synchronize=False, mode="gpu") == [
        (str(RaceKind.HOST_D2H), "staging")]
    assert _read_after_d2h(READS[name], synchronize=True, mode="gpu") == []


def test_elements_the_copy_does_not_write_are_read_race_free():
    with watch("cpu") as w:
        x = torch.arange(8, device="cuda")
        staging = torch.zeros(8, dtype=torch.int64, pin_memory=True)
        host = staging.numpy()
        staging[4:].copy_(x[4:], non_blocking=True)
        head = np.array(host[:4]), host[:4].tobytes(), np.sum(host[:4]), list(host[::-1][4:])
        tail = host[4:].sum()  # the copied elements: this one races
    assert [int(v) for v in head[0]] == [0, 0, 0, 0] and int(tail) == 4 + 5 + 6 + 7
    races = [r for r in w.races if r.buffer.startswith("staging")]
    assert len(races) == 1 and races[0].second.op_name == "ndarray.sum"


def test_views_stored_into_lists_dicts_and_names_read_nothing():
    with watch("cpu") as w:
        x = torch.arange(8, device="cuda")
        staging = torch.zeros(8, dtype=torch.int64, pin_memory=True)
        host = staging.numpy()
        done = torch.cuda.Event()
        staging.copy_(x, non_blocking=True)
        done.record()
        views: dict[str, Any] = {}
        views["head"] = host[:N]
        slots: list[Any] = [None]
        slots[0] = host[N:]
        tail = host[N:]
        assert w.races == []  # nothing read yet
        done.synchronize()
        assert views["head"].tolist() == list(range(N)) and int(tail.sum() + slots[0][0]) == 19
    assert w.races == []


# Host writes of pinned memory an H2D copy may still be reading: (NumPy view, new values).
WRITES: dict[str, Callable[[np.ndarray, np.ndarray], Any]] = {
    "np.copyto": lambda h, new: np.copyto(h, new),
    "slice assignment": lambda h, new: h.__setitem__(slice(0, N), new[:N]),
    "np.put": lambda h, new: np.put(h, [2], 9),
    "in-place ufunc": lambda h, new: np.add(h, new, out=h),
}


def _write_after_h2d(write: Callable[..., Any], synchronize: bool) -> list[tuple[str, str]]:
    with watch("cpu") as w:
        staging = torch.arange(8, dtype=torch.int64).pin_memory()
        device = torch.zeros(8, dtype=torch.int64, device="cuda")
        done = torch.cuda.Event()
        device.copy_(staging, non_blocking=True)  # the stream reads the pinned buffer
        done.record()
        if synchronize:
            done.synchronize()
        write(staging.numpy(), np.full(8, 7, dtype=np.int64))
    return _kinds(w)


@pytest.mark.parametrize("name", sorted(WRITES))
def test_numpy_write_before_the_sync_races_and_its_twin_does_not(name):
    racy = _write_after_h2d(WRITES[name], synchronize=False)
    assert racy and {buffer for _, buffer in racy} == {"staging"}
    assert _write_after_h2d(WRITES[name], synchronize=True) == []


def test_raw_pointer_makes_the_verdict_incomplete_and_patches_are_undone():
    with watch("cpu") as w:
        staging = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        pointer = staging.numpy().ctypes.data
    assert pointer and not w.complete
    assert [u.name for u in w.unknown_ops] == ["ndarray.ctypes"]
    assert np.array is ORIGINAL_ARRAY and type(staging.numpy()) is np.ndarray


PROGRAM = textwrap.dedent("""\
    import ctypes
    import sys
    import numpy as np
    import torch

    staging = torch.zeros(4, dtype=torch.int64, pin_memory=True)
    host = staging.numpy()
    done = torch.cuda.Event()
    staging.copy_(torch.arange(4, device="cuda"), non_blocking=True)
    done.record()
    done.synchronize()
    if "--raw" in sys.argv:  # a foreign function given the raw pointer: not followed
        first = ctypes.c_int64.from_address(host.__array_interface__["data"][0]).value
    else:
        first = int(host[0])
    print("first", first)
    """)


@pytest.mark.parametrize("raw, status", [(True, 2), (False, 0)])
def test_check_exits_2_when_numpy_hands_out_the_raw_pointer(tmp_path: Path, capsys, raw,
                                                            status):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    assert main(["check", "--cpu", str(path), *(["--raw"] if raw else [])]) == status
    captured = capsys.readouterr()
    assert "first 0" in captured.out  # issue order: the copy's values are the serial ones
    assert ("incomplete" in captured.err) == raw


def test_data_ptr_of_pinned_memory_is_an_op_of_unknown_access_on_the_host():
    with watch("cpu") as w:
        staging = torch.zeros(4, dtype=torch.int64, pin_memory=True)
        unwatched = torch.zeros(4, dtype=torch.int64)
        pointers = staging.data_ptr(), unwatched.data_ptr()
    assert all(pointers)
    assert [(u.name, u.stream, u.tensors[0].split("@")[0]) for u in w.unknown_ops] == [
        ("data_ptr", "host", "staging")]
