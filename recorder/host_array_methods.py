"""The ndarray methods NumPy runs in C, recorded on a :class:`recorder.host_arrays.HostArray`,
and :func:`host_array`, which makes one (importing this module installs the methods).

NumPy runs these without calling Python on the array (``tobytes``, ``item``, ``argmax``,
``sort``, ``copy``, ``astype``, printing, ``int()``...): each is replaced on the subclass by a
wrapper that runs the plain method on a plain view and records what it read (every element,
unless the result is a view of the same memory; ``item(i)`` and ``take`` only the elements
picked) and wrote (``sort``, ``partition``, ``fill``, ``put``, ``byteswap(inplace=True)``,
``setfield``). The attributes that hand the raw memory out (``ctypes``, ``data``,
``__array_interface__``, ``__array_struct__``, ``flat``, ``__dlpack__``) record an op of unknown
access: the verdict is incomplete.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from overlap_harness.recorder.core import Recording, StorageInfo
from overlap_harness.recorder.host_arrays import HostArray, plain, put_probe, read_all, rewrap


def _method(name: str, writes: bool) -> Callable[..., Any]:
    """An ndarray method NumPy runs in C: the elements it reads (all of the array's, unless
    the result is a view) and, for ``writes``, writes, recorded around the plain method."""
    original = getattr(np.ndarray, name)
    label = f"ndarray.{name}"

    def call(self: HostArray, *args: Any, **kwargs: Any) -> Any:
        if not self._watched():
            result = original(self.view(np.ndarray), *plain(args), **plain(kwargs))
            return self._adopt(result) if self._holds(result) else result
        out = kwargs.get("out")
        read_all((args, {k: v for k, v in kwargs.items() if k != "out"}), label)
        if isinstance(out, HostArray):
            out._note(label, True)
        result = original(self.view(np.ndarray), *plain(args), **plain(kwargs))
        if name == "fill":
            self._note(label, True)
            return result
        if out is not None:  # NumPy hands back ``out`` itself
            self._note(label, False)
            return out
        result, viewed = rewrap(result, [self])
        if id(self) not in viewed:
            self._note(label, False)
        if writes and (name != "byteswap" or (args[:1] or [kwargs.get("inplace")])[0]):
            self._note(label, True)
        return result
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``ndarray.{name}``, recorded (see :func:`_method`)."
    return call


def _exporting(name: str) -> property:
    """An attribute that hands the raw memory out: recorded as an op of unknown access."""
    descriptor = np.ndarray.__dict__[name]

    def get(self: HostArray) -> Any:
        self._note_unknown(f"ndarray.{name}")
        return descriptor.__get__(self.view(np.ndarray))
    return property(get, doc=f"``ndarray.{name}``: the memory leaves the recorder's sight.")


_READING = ("all", "any", "argmax", "argmin", "argpartition", "argsort", "astype", "choose",
            "clip", "compress", "conj", "conjugate", "copy", "cumprod", "cumsum", "diagonal",
            "dot", "dump", "dumps", "flatten", "getfield", "item", "max", "mean", "min",
            "nonzero", "prod", "ravel", "repeat", "reshape", "round", "searchsorted", "squeeze",
            "std", "sum", "swapaxes", "take", "tobytes", "tofile", "tolist", "trace",
            "transpose", "var", "__copy__", "__deepcopy__", "__int__", "__float__",
            "__complex__", "__bool__", "__index__", "__contains__", "__repr__", "__str__",
            "__format__", "__array__", "to_device")
_WRITING = ("sort", "partition", "byteswap", "fill", "setfield")
for _name in _READING + _WRITING:
    if hasattr(np.ndarray, _name):
        setattr(HostArray, _name, _method(_name, _name in _WRITING))
for _name in ("ctypes", "data", "__array_interface__", "__array_struct__", "flat"):
    setattr(HostArray, _name, _exporting(_name))


def _item(self: HostArray, *args: Any) -> Any:
    """``ndarray.item``: with an index, only that element is read."""
    result = np.ndarray.item(self.view(np.ndarray), *args)
    if not args:
        self._note("ndarray.item", False)
    elif len(args) == 1 and not isinstance(args[0], tuple):
        self._note("ndarray.item", False, np.unravel_index(args[0] % self.size, self.shape))
    else:
        self._note("ndarray.item", False, args[0] if len(args) == 1 else args)
    return result


def _take(self: HostArray, indices: Any, axis: Any = None, out: Any = None,
          mode: str = "raise") -> Any:
    """``ndarray.take``: only the elements taken are read."""
    read_all(indices, "ndarray.take")
    picked = np.ndarray.take(np.arange(self.size).reshape(self.shape), plain(indices), axis,
                             None, mode)
    result = np.ndarray.take(self.view(np.ndarray), plain(indices), axis, plain(out), mode)
    self._note("ndarray.take", False, np.unravel_index(np.asarray(picked).reshape(-1),
                                                       self.shape))
    if isinstance(out, HostArray):
        out._note("ndarray.take", True)
        return out
    return result


HostArray.item = _item  # type: ignore[method-assign]
HostArray.take = _take  # type: ignore[method-assign]


def _dlpack(self: HostArray, *args: Any, **kwargs: Any) -> Any:
    self._note_unknown("ndarray.__dlpack__")
    return self.view(np.ndarray).__dlpack__(*args, **kwargs)


HostArray.__dlpack__ = _dlpack  # type: ignore[method-assign]


def _put(self: HostArray, indices: Any, values: Any, mode: str = "raise") -> None:
    read_all(values, "ndarray.put")
    self._note("ndarray.put", True, put_probe(self, (self, indices, values, mode), {}))
    np.ndarray.put(self.view(np.ndarray), plain(indices), plain(values), mode)


HostArray.put = _put  # type: ignore[method-assign]

def host_array(recording: Recording, info: StorageInfo, t: torch.Tensor, live: Any) -> HostArray:
    """``t.numpy()`` for a watched pinned tensor: a :class:`HostArray` over its memory.
    ``live()`` says whether the watch that made it still runs (after it, nothing records)."""
    with torch._C.DisableTorchFunction():
        plain_array = t.numpy()
        storage = t.untyped_storage()
        base_ptr, nbytes = storage.data_ptr(), storage.nbytes()
    array = plain_array.view(HostArray)
    array._recording = recording
    array._info = info
    array._base_ptr = base_ptr
    array._end_ptr = base_ptr + nbytes
    array._live = live
    array._tensor = t
    return array
