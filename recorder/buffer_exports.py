"""The buffer protocol of NumPy views of watched pinned memory: no consumer reads it silently.

``bytes(h)``, ``bytearray(h)``, ``memoryview(h)``, ``struct.unpack_from(fmt, h)``,
``array.array(...).frombytes(memoryview(h))``, ``ctypes``' ``from_buffer`` and
``from_buffer_copy``, ``hashlib``, a file's ``write(h)``: each takes a
:class:`recorder.host_arrays.HostArray`'s memory through the buffer protocol, C to C, with no
Python method of the array called. Every export of a watched array is seen here and becomes:

- a host read of the exported elements, recorded at the export (the consumer may read any of
  them from then on);
- when the consumer lets go before any other node was recorded (``bytes``, ``struct``,
  ``from_buffer_copy``: copy, then release, in one call), that read is all it did;
- when it still holds the memory after another node was recorded (a ``memoryview`` or a
  ``ctypes`` array over it, read later), it may have read at any point since: an op of
  unknown access at the release, or at the end of the watch if it is never released; the
  verdict is incomplete (``check`` exits 2), never a silent pass.

How the export is seen. Python 3.12 lets a class define ``__buffer__`` and
``__release_buffer__`` (PEP 688): :func:`install` gives :class:`HostArray` both. Python 3.11
has no such hook, so :func:`install` writes two ctypes callbacks into the ``bf_getbuffer`` and
``bf_releasebuffer`` slots of ``HostArray``'s own buffer table (a heap type holds its own
copy, inherited from ``np.ndarray``'s; NumPy's table and plain arrays are untouched). The
callback calls NumPy's ``bf_getbuffer`` and records the export. One limit of that route: a
ctypes callback cannot hand a Python exception back to C, so an export NumPy refuses (a
writable buffer of a read-only array, a contiguous one of a strided view) fails with
``SystemError`` instead of NumPy's own ``ValueError`` or ``BufferError``; the program failed
there either way. Where the slot table is not where CPython 3.11 puts it (another
interpreter), :data:`HOOKED` is False and docs/numpy-host-access.md says what is then not
seen.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.recorder.core import Recording
from overlap_harness.recorder.host_arrays import HostArray
from overlap_harness.recorder.sites import user_site

READ = "buffer protocol"
HELD = "buffer protocol (the memory held by its consumer across other work)"

# export key -> (array, recording, nodes recorded once the export's read was, its site): the
# exports of watched arrays not yet released
_OPEN: dict[int, tuple[HostArray, Recording, int, str]] = {}


def exported(array: HostArray, key: int) -> None:
    """``array``'s memory was exported (``key`` names the export until its release)."""
    if not array._watched():
        return
    recording = array._recording
    array._note(READ, False)
    _OPEN[key] = (array, recording, len(recording.timeline), user_site())


def released(key: int) -> None:
    """The export ``key`` was released: unknown access if other nodes came in between."""
    entry = _OPEN.pop(key, None)
    if entry is not None:
        _settle(*entry)


def _settle(array: HostArray, recording: Recording, nodes_at_export: int, site: str) -> None:
    """An unknown access, at the export's site, if nodes were recorded while it was held."""
    if len(recording.timeline) != nodes_at_export and array._info is not None:
        recording.unknown(HELD, HOST_AGENT, [array._info.name], site)


@contextmanager
def closing(recording: Recording) -> Iterator[None]:
    """While a watch runs; at its end, an export of its arrays still held is settled."""
    try:
        yield
    finally:
        for key, entry in list(_OPEN.items()):
            if entry[1] is recording:
                del _OPEN[key]
                _settle(*entry)


# -- Python 3.12+: ``__buffer__`` and ``__release_buffer__`` -------------------------------
def _buffer(self: HostArray, flags: int) -> memoryview:
    """``HostArray.__buffer__``: a memoryview of the plain array, the export recorded."""
    view = memoryview(self.view(np.ndarray))
    exported(self, id(view))
    return view


def _release_buffer(self: HostArray, view: memoryview) -> None:
    """``HostArray.__release_buffer__``."""
    released(id(view))


# -- Python 3.11: the slots of HostArray's buffer table ------------------------------------
_TP_AS_BUFFER = 20 * ctypes.sizeof(ctypes.c_void_p)  # PyTypeObject.tp_as_buffer (CPython)
_GETBUFFER = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p, ctypes.c_int)
_RELEASEBUFFER = ctypes.PYFUNCTYPE(None, ctypes.py_object, ctypes.c_void_p)


def _buffer_table(kind: type) -> int | None:
    """The address of ``kind``'s ``PyBufferProcs``, or None where the layout is not
    CPython's."""
    if sys.implementation.name != "cpython":
        return None
    return ctypes.c_void_p.from_address(id(kind) + _TP_AS_BUFFER).value


def install() -> bool:
    """Hook HostArray's buffer slots (Python 3.11); True when the exports are seen."""
    if sys.version_info >= (3, 12):  # PEP 688: the class's own methods fill the slots
        HostArray.__buffer__ = _buffer  # type: ignore[attr-defined]
        HostArray.__release_buffer__ = _release_buffer  # type: ignore[attr-defined]
        return True
    table, numpy_table = _buffer_table(HostArray), _buffer_table(np.ndarray)
    if table is None or numpy_table is None:
        return False
    slots = (ctypes.c_void_p * 2).from_address(table)
    numpy_get = (ctypes.c_void_p * 2).from_address(numpy_table)[0]
    inside = id(HostArray) < table < id(HostArray) + type(HostArray).__sizeof__(HostArray)
    if not inside or slots[0] != numpy_get or slots[1] is not None:
        return False  # not a heap type's own table that inherited NumPy's: leave it alone
    numpy_getbuffer = _GETBUFFER(numpy_get)

    def getbuffer(exporter: Any, view: int, flags: int, _get: Any = numpy_getbuffer) -> int:
        try:
            status = _get(exporter, view, flags)
        except BaseException:  # NumPy refused (see the module docstring)
            return -1
        try:  # noqa: SIM105 - plain try: at interpreter exit the module's globals are None
            exported(exporter, view)
        except BaseException:  # recording never fails the program's export
            pass
        return status

    def releasebuffer(exporter: Any, view: int) -> None:
        try:  # noqa: SIM105 - plain try: at interpreter exit the module's globals are None
            released(view)
        except BaseException:
            pass

    hooks = (_GETBUFFER(getbuffer), _RELEASEBUFFER(releasebuffer))
    HostArray._buffer_hooks = hooks  # kept alive as long as the class and its arrays
    slots[0] = ctypes.cast(hooks[0], ctypes.c_void_p).value
    slots[1] = ctypes.cast(hooks[1], ctypes.c_void_p).value
    return True


HOOKED = install()
