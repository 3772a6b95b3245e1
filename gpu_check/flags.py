"""Gates on CUDA: flags in pinned memory that hold an op's work until another op has ended.

The plan (``overlap_harness.replay.gates``) lists pairs of :data:`model.opkeys.OpKey` s. Each pair
gets one 32-bit flag in a pinned host buffer, mapped into the device's address space:

- the op that must finish first sets it: a stream op by ``cuStreamWriteValue32`` after its
  end mark (the driver's default flags order the op's writes before the flag), a host op by
  a plain store after it ran;
- the op that must wait checks it before its work: a stream op by ``cuStreamWaitValue32``
  (``>= 1``) queued after its cost sleep, a host op by polling it.

Nothing here is recorded in the trace. A watchdog thread sets every flag after
``timeout_s``, so a gate whose setter never comes (a run that left the plan's path) cannot
hang the GPU; :meth:`GateSet.close` releases the flags nobody set and reports both.
The driver's stream memory operations are reached through ``ctypes`` (torch does not wrap
them); they are core on Linux with CUDA >= 12 (``cuStreamWaitValue32_v2``).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch

from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.opkeys import Gate, OpKey

WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
WRITE_DEFAULT = 0x0  # CU_STREAM_WRITE_VALUE_DEFAULT: earlier writes are visible first


@dataclass(frozen=True, slots=True)
class _Driver:
    wait: ctypes._CFuncPtr  # type: ignore[name-defined]
    write: ctypes._CFuncPtr  # type: ignore[name-defined]
    dptr: ctypes._CFuncPtr  # type: ignore[name-defined]


@cache
def driver() -> _Driver:
    """The three driver entry points, loaded once."""
    lib = ctypes.CDLL("libcuda.so.1")

    def fn(*names: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
        for n in names:
            if hasattr(lib, n):
                return getattr(lib, n)
        raise DeviceUsageError(f"the CUDA driver has none of {names}")

    wait = fn("cuStreamWaitValue32_v2", "cuStreamWaitValue32")
    write = fn("cuStreamWriteValue32_v2", "cuStreamWriteValue32")
    for f in (wait, write):
        f.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        f.restype = ctypes.c_int
    dptr = fn("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer")
    dptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    dptr.restype = ctypes.c_int
    return _Driver(wait, write, dptr)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise DeviceUsageError(f"{what} failed with CUresult {rc}")


@dataclass(frozen=True, slots=True)
class GateStats:
    """What happened to a run's gates: how many, how many were never set by their op (the
    run left the plan's path) and whether the watchdog had to release them."""

    gates: int
    unset: int
    timed_out: bool


class GateSet:
    """The flags of one run (see the module docstring)."""

    def __init__(self, gates: Sequence[Gate], timeout_s: float = 5.0) -> None:
        self.n = len(gates)
        self._flags = torch.zeros(max(self.n, 1), dtype=torch.int32, pin_memory=True)
        self._host = self._flags.numpy()
        base = ctypes.c_uint64()
        _check(driver().dptr(ctypes.byref(base), ctypes.c_void_p(self._flags.data_ptr()), 0),
               "cuMemHostGetDevicePointer")
        self._base = base.value
        self.waits: dict[OpKey, list[int]] = {}
        self.sets: dict[OpKey, list[int]] = {}
        for i, (first, then) in enumerate(gates):
            self.sets.setdefault(first, []).append(i)
            self.waits.setdefault(then, []).append(i)
        self._issued: set[int] = set()
        self.timed_out = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.timed_out = True
        self._host[:] = 1

    def _addr(self, i: int) -> int:
        return self._base + 4 * i

    def stream_wait(self, key: OpKey, stream: torch.cuda.Stream) -> None:
        """Queue on ``stream``: wait until every flag ``key`` waits for is set."""
        for i in self.waits.get(key, ()):
            _check(driver().wait(ctypes.c_void_p(stream.cuda_stream), self._addr(i), 1,
                                 WAIT_GEQ), "cuStreamWaitValue32")

    def stream_set(self, key: OpKey, stream: torch.cuda.Stream) -> None:
        """Queue on ``stream``: set every flag ``key`` owns."""
        for i in self.sets.get(key, ()):
            _check(driver().write(ctypes.c_void_p(stream.cuda_stream), self._addr(i), 1,
                                  WRITE_DEFAULT), "cuStreamWriteValue32")
            self._issued.add(i)

    def host_wait(self, key: OpKey) -> None:
        """Spin on the host until every flag ``key`` waits for is set."""
        for i in self.waits.get(key, ()):
            while self._host[i] == 0:
                time.sleep(0)

    def host_set(self, key: OpKey) -> None:
        """Set, from the host, every flag ``key`` owns."""
        for i in self.sets.get(key, ()):
            self._host[i] = 1
            self._issued.add(i)

    def close(self) -> GateStats:
        """Release the flags no op was going to set (so the device can drain); the stats."""
        self._timer.cancel()
        unset = [i for i in range(self.n) if i not in self._issued]
        if unset:
            self._host[np.asarray(unset)] = 1
        return GateStats(self.n, len(unset), self.timed_out)
