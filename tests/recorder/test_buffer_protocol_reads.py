"""Python-level reads of watched pinned memory through the buffer protocol (CPU mode).

``bytes(t.numpy())``, ``memoryview``, ``struct``, ``array``, ``ctypes``, ``hashlib``, a file's
``write``: each takes the memory of a ``HostArray`` C to C (recorder/buffer_exports.py). A
read that lets go at once races a non_blocking D2H copy into the same elements, and its twin
with the stream synchronized before the read does not; a consumer that holds the memory
across other work makes the verdict incomplete, and its twin that lets go first does not.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import io
import struct
from collections.abc import Callable

import pytest
import torch

from overlap_harness.recorder import watch
from overlap_harness.recorder.api import check_script

N = 8

READS: dict[str, Callable[[object], object]] = {
    "bytes": lambda h: bytes(h),
    "bytearray": lambda h: bytearray(h),
    "memoryview item": lambda h: memoryview(h)[0],
    "memoryview tolist": lambda h: memoryview(h).tolist(),
    "struct.unpack_from": lambda h: struct.unpack_from("f", h),
    "struct.unpack": lambda h: struct.unpack(f"{N}f", h),
    "struct.iter_unpack": lambda h: list(struct.iter_unpack("f", h)),
    "array frombytes": lambda h: array.array("f").frombytes(memoryview(h).cast("B")),
    "array from bytes": lambda h: array.array("f", bytes(h)),
    "ctypes from_buffer_copy": lambda h: (ctypes.c_float * N).from_buffer_copy(h),
    "ctypes from_buffer item": lambda h: (ctypes.c_float * N).from_buffer(h)[0],
    "hashlib": lambda h: hashlib.sha256(h).digest(),
    "file write": lambda h: io.BytesIO().write(h),
}


def _read_after_d2h(read: Callable[[object], object], synchronized: bool):
    with watch("cpu") as watcher:
        device = torch.arange(N, dtype=torch.float32, device="cuda")
        pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
        pinned.copy_(device, non_blocking=True)
        if synchronized:
            torch.cuda.current_stream().synchronize()
        read(pinned.numpy())
        torch.cuda.current_stream().synchronize()
    return watcher


@pytest.mark.parametrize("form", sorted(READS))
def test_a_buffer_read_before_the_sync_races_the_copy(form):
    watcher = _read_after_d2h(READS[form], synchronized=False)
    assert [(str(r.kind), r.buffer.split("@")[0], r.first.op_name, r.second.op_name)
            for r in watcher.races] == [("host-D2H", "pinned", "copy_", "buffer protocol")]
    assert watcher.complete


@pytest.mark.parametrize("form", sorted(READS))
def test_a_buffer_read_after_the_sync_is_race_free(form):
    watcher = _read_after_d2h(READS[form], synchronized=True)
    assert watcher.races == []
    assert watcher.complete


def test_the_exported_view_alone_is_read():
    """``bytes(h[4:])`` reads elements 4..7; the copy wrote 0..3 only: no race."""
    with watch("cpu") as watcher:
        device = torch.arange(4, dtype=torch.float32, device="cuda")
        pinned = torch.zeros(N, dtype=torch.float32, pin_memory=True)
        pinned[:4].copy_(device, non_blocking=True)
        bytes(pinned.numpy()[4:])
        overlapping = bytes(pinned.numpy()[3:])
    assert len(overlapping) == 5 * 4
    assert [r.elements for r in watcher.races] == [(3,)]


HOLDERS: dict[str, Callable[[object], Callable[[], object]]] = {
    "memoryview": lambda h: (lambda view: lambda: view[0])(memoryview(h)),
    "ctypes from_buffer": lambda h: (lambda c: lambda: c[0])((ctypes.c_float * N).from_buffer(h)),
}


def _held_across_work(hold: Callable[[object], Callable[[], object]], let_go_first: bool):
    """The consumer takes the memory before a D2H copy; read after the stream's sync."""
    with watch("cpu") as watcher:
        device = torch.arange(N, dtype=torch.float32, device="cuda")
        pinned = torch.empty(N, dtype=torch.float32, pin_memory=True)
        read = hold(pinned.numpy())
        if let_go_first:
            read()
            del read  # the consumer lets go before any other work
        pinned.copy_(device, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        if not let_go_first:
            read()  # when it read, the recorder cannot see: incomplete, not a pass
    return watcher


@pytest.mark.parametrize("form", sorted(HOLDERS))
def test_a_consumer_that_holds_the_memory_across_work_makes_the_verdict_incomplete(form):
    watcher = _held_across_work(HOLDERS[form], let_go_first=False)
    assert not watcher.complete
    assert [op.name for op in watcher.unknown_ops] == [
        "buffer protocol (the memory held by its consumer across other work)"]
    assert watcher.unknown_ops[0].tensors[0].startswith("pinned@")


@pytest.mark.parametrize("form", sorted(HOLDERS))
def test_a_consumer_that_lets_go_before_other_work_is_a_read(form):
    watcher = _held_across_work(HOLDERS[form], let_go_first=True)
    assert watcher.complete
    assert watcher.races == []


def test_an_export_numpy_refuses_still_fails_the_program():
    """A contiguous export of a strided view: NumPy refuses it; the program sees an error
    (SystemError through the Python 3.11 hook, NumPy's own error on 3.12+), no crash."""
    with watch("cpu"):
        pinned = torch.zeros(N, pin_memory=True)
        with pytest.raises((SystemError, BufferError, ValueError)):
            struct.unpack_from("f", pinned.numpy()[::2])


SCRIPT = """
import torch
device = torch.arange(8, dtype=torch.float32, device="cuda")
pinned = torch.empty(8, dtype=torch.float32, pin_memory=True)
pinned.copy_(device, non_blocking=True)
{sync}
print(len(bytes(pinned.numpy())))
"""


@pytest.mark.parametrize(("sync", "races"), [("", 1),
                                             ("torch.cuda.current_stream().synchronize()", 0)])
def test_check_reports_bytes_of_a_numpy_view(tmp_path, sync, races):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT.format(sync=sync))
    result = check_script(script)
    assert result.complete
    assert len(result.races) == races


def test_the_buffer_hook_is_installed_on_cpython():
    """Python 3.11 sees exports through the slots, 3.12+ through ``__buffer__``: either way
    the hook is in place (a layout it did not recognise would leave exports unseen)."""
    from overlap_harness.recorder import buffer_exports

    assert buffer_exports.HOOKED
