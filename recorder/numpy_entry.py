"""Where NumPy views of pinned memory meet code that does not dispatch to them.

:class:`recorder.host_arrays.HostArray` sees what NumPy hands to Python; three entries need
help from outside it, installed while a watch runs (both modes):

- the NumPy constructors that never dispatch (``np.array``, ``np.asarray``,
  ``np.asanyarray``, ``np.ascontiguousarray``, ``np.asfortranarray``): replaced, so that a
  copy of a ``HostArray`` (or of a watched pinned tensor) is a host read and a view stays a
  ``HostArray`` (``np.asarray(pinned[:n])`` reads nothing until its elements are read);
- torch functions given a ``HostArray``: the function layers call :func:`torch_arguments`
  (``torch.tensor(h)`` reads it; ``torch.as_tensor``/``torch.asarray`` alias the pinned tensor,
  a watched view), and ``torch.from_numpy`` is replaced (torch's function modes never see it);
- ``np.frombuffer`` of a ``HostArray``: the memory leaves for an alias the recorder cannot
  follow, an op of unknown access (the verdict is incomplete).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from overlap_harness.recorder.host_arrays import (
    HostArray,
    address,
    host_arrays_in,
    plain,
    read_all,
)
from overlap_harness.recorder.patching import Patch


def torch_alias(array: HostArray) -> torch.Tensor | None:
    """A tensor view of the pinned tensor over exactly ``array``'s elements (watched, since it
    shares the pinned storage), or None where dtype or strides do not map."""
    source = array._tensor
    if source is None:
        return None
    with torch._C.DisableTorchFunction():
        dtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
        size = array.itemsize
        if dtype != source.dtype or any(s % size or s < 0 for s in array.strides):
            return None
        return source.as_strided(array.shape, [s // size for s in array.strides],
                                 (address(array) - array._base_ptr) // size)


_ALIASING = (torch.as_tensor, torch.asarray)


def torch_arguments(func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A torch function's arguments with its ``HostArray`` ones handled: ``as_tensor`` and
    ``asarray`` alias the pinned tensor (the alias is watched); any other function reads
    them (``torch.tensor(h)`` copies) and gets plain arrays."""
    if func in _ALIASING and args and isinstance(args[0], HostArray):
        alias = torch_alias(args[0])
        if alias is not None:
            return (alias, *args[1:]), kwargs
        args[0]._note_unknown(f"torch.{func.__name__} of a NumPy view it cannot map")
    name = f"torch.{getattr(func, '__name__', 'function')}"
    read_all((args, kwargs), name)
    return plain(args), plain(kwargs)


def holds_host_array(args: tuple, kwargs: dict | None) -> bool:
    """A cheap test for the torch function layer: a ``HostArray`` among the arguments (or the
    first item of a list or tuple argument)."""
    for value in (*args, *kwargs.values()) if kwargs else args:
        if type(value) is HostArray:
            return True
        if type(value) in (list, tuple) and value and type(value[0]) is HostArray:
            return True
    return False


def numpy_patches(host_view: Callable[[Any], HostArray | None]) -> list[Patch]:
    """The NumPy constructors that do not dispatch, and ``torch.from_numpy``, replaced while
    a watch runs. ``host_view(t)`` is the ``HostArray`` of a watched pinned tensor ``t`` (no
    access recorded), else None."""
    def constructor(name: str) -> Any:
        original = getattr(np, name)

        def make(obj: Any, *args: Any, **kwargs: Any) -> Any:
            source = host_view(obj) if isinstance(obj, torch.Tensor) else obj
            if isinstance(source, HostArray):
                result = original(source.view(np.ndarray), *args, **kwargs)
                if source._holds(result):
                    return source._adopt(result)  # a view: read when its elements are
                source._note(f"np.{name}", False)
                return result
            if isinstance(obj, list | tuple) and host_arrays_in(obj):
                read_all(obj, f"np.{name}")
                return original(plain(obj), *args, **kwargs)
            return original(obj, *args, **kwargs)
        make.__name__ = make.__qualname__ = name
        make.__doc__ = original.__doc__
        return make

    original_from_numpy = torch.from_numpy
    original_frombuffer = np.frombuffer

    def from_numpy(array: Any) -> torch.Tensor:
        if isinstance(array, HostArray):
            alias = torch_alias(array)
            if alias is not None:
                return alias
            array._note_unknown("torch.from_numpy of a NumPy view it cannot map")
            return original_from_numpy(array.view(np.ndarray))
        return original_from_numpy(array)

    def frombuffer(buffer: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        for array in host_arrays_in(buffer):
            array._note_unknown("np.frombuffer")
        return original_frombuffer(plain(buffer), *args, **kwargs)

    names = ("array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray")
    return ([(np, name, constructor(name)) for name in names]
            + [(torch, "from_numpy", from_numpy), (np, "frombuffer", frombuffer)])
