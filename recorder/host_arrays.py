"""NumPy views of watched pinned memory: every host access made through NumPy is recorded.

``pinned.numpy()`` (both modes) returns a :class:`HostArray`: an ``np.ndarray`` subclass over
the pinned memory that records each host read and write made through it, element-precise
(the storage elements its offset and strides name), as a host access of the pinned buffer
(STREAM-SEMANTICS.md, "Memory and accesses"). Taking a view (a basic slice, ``reshape``,
``T``, ``np.asarray``) reads nothing: the view is a ``HostArray`` too, and reading its
elements later is the access. Everything else that reads or writes elements is recorded
where NumPy lets Python see it (facts of NumPy 2.x, checked on 2.4):

- item access and assignment in both directions (``dst[:n] = src[:n]`` records the write of
  ``dst``'s elements and the read of ``src``'s; an index array from pinned memory is read);
- ufuncs (``__array_ufunc__``: operators, reductions such as ``.sum()``/``.max()``, which
  NumPy runs as ufunc reductions, ``out=``, ``where=``, ``ufunc.at``);
- NumPy functions (``__array_function__``: ``np.copyto``, ``np.sum``, ``np.concatenate``,
  ``np.put``...; which elements ``np.copyto(where=)``, ``np.put``, ``np.place``,
  ``np.putmask``, ``np.put_along_axis`` and ``np.fill_diagonal`` write is computed);
- the ndarray methods NumPy runs in C (``tobytes``, ``item``, ``argmax``, ``sort``, ``copy``,
  ``astype``, printing, ``int()``/``float()``/``bool()``...: :mod:`recorder.host_array_methods`,
  which also makes a ``HostArray``), pickling and iteration;
- the constructors NumPy does not dispatch (``np.array``, ``np.asarray``, ``np.asanyarray``,
  ``np.ascontiguousarray``, ``np.asfortranarray``), replaced while a watch runs: a copy is a
  read, a view stays a ``HostArray``; given a watched pinned tensor they act as on its
  ``.numpy()`` (``np.asarray(pinned[:n])`` is a view, read when its elements are);
- torch functions given a ``HostArray`` (``torch.tensor(h)`` reads it; ``torch.from_numpy``,
  ``torch.as_tensor`` and ``torch.asarray`` alias it as a view of the pinned tensor, watched).

Where the memory leaves for code the recorder cannot follow (``.ctypes``, ``.data``,
``__array_interface__``, ``__array_struct__``, ``__dlpack__``, ``.flat``, ``np.frombuffer``),
an op of unknown access is recorded: the verdict is incomplete (``check`` exits 2), never a
silent pass. The buffer protocol (``bytes(h)``, ``memoryview(h)``, ``struct``, ``ctypes``'
``from_buffer``...) is a host read, or an unknown access when its consumer holds the memory
across other work (:mod:`recorder.buffer_exports`).

NumPy's own C copy of a view into a plain (unwatched) array (``plain[:n] = host[:n]``) calls
no Python code on the source: :mod:`recorder.stored_views` finds it from the statement when
the view is taken. The constructors and torch entries are :mod:`recorder.numpy_entry`'s.
Not seen: a bare ``HostArray`` copied into a plain array (``plain[:n] = host``);
docs/numpy-host-access.md lists it and the other limits.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Access, Recording, StorageInfo
from overlap_harness.recorder.elements import to_storage_elements
from overlap_harness.recorder.stored_views import stored_into

_INTERFACE = np.ndarray.__dict__["__array_interface__"]  # the base class's, never ours
_ALL = slice(None)


def address(a: np.ndarray) -> int:
    """The address of ``a``'s first element."""
    return _INTERFACE.__get__(a)["data"][0]


class HostArray(np.ndarray):
    """A NumPy view of watched pinned memory that records the host's accesses through it."""

    _recording: Recording | None
    _info: StorageInfo | None
    _base_ptr: int
    _end_ptr: int
    _live: Any
    _tensor: Any  # the pinned tensor whose memory this views (torch aliases are made of it)

    def __array_finalize__(self, obj: Any) -> None:
        inside = isinstance(obj, HostArray) and obj._holds(self)
        source = obj if inside else None  # a copy NumPy made in C is no view: not watched
        self._recording = getattr(source, "_recording", None)
        self._info = getattr(source, "_info", None)
        self._base_ptr = getattr(source, "_base_ptr", 0)
        self._end_ptr = getattr(source, "_end_ptr", 0)
        self._live = getattr(source, "_live", None)
        self._tensor = getattr(source, "_tensor", None)

    # -- element sets ----------------------------------------------------------------------
    def _watched(self) -> bool:
        return (self._recording is not None and self._live is not None and self._live()
                and self._info is not None and self._info.alive())

    def _element_ids(self) -> np.ndarray:
        """The storage element (of this array's item size) behind each item."""
        itemsize = self.itemsize
        first = (address(self) - self._base_ptr) // itemsize
        ids = np.full(self.shape, first, dtype=np.int64)
        for axis, (size, stride) in enumerate(zip(self.shape, self.strides, strict=True)):
            shape = [1] * self.ndim
            shape[axis] = size
            ids = ids + (np.arange(size, dtype=np.int64) * (stride // itemsize)).reshape(shape)
        return ids

    def _note(self, name: str, write: bool, key: Any = _ALL) -> None:
        """Record a host read (or write) of the elements ``self[key]`` names."""
        if not self._watched():
            return
        ids = self._element_ids()
        picked = np.asarray(ids if key is _ALL else ids[key]).reshape(-1)
        if picked.size == 0:
            return
        info = self._info
        access = Access(info, np.unique(to_storage_elements(picked, self.itemsize,
                                                            info.itemsize)), write)
        kind = OpKind.HOST_WRITE if write else OpKind.HOST_READ
        self._recording.op(name, HOST_AGENT, [access], kind)

    def _note_unknown(self, name: str) -> None:
        """The memory handed to code the recorder cannot follow: the verdict is incomplete."""
        if self._watched():
            self._recording.unknown(name, HOST_AGENT, [self._info.name])

    def _adopt(self, plain: np.ndarray) -> HostArray:
        """``plain`` (a view of this array's memory) as a watched ``HostArray``."""
        view = plain.view(HostArray)
        view._recording, view._info, view._live = self._recording, self._info, self._live
        view._base_ptr, view._end_ptr, view._tensor = self._base_ptr, self._end_ptr, self._tensor
        return view

    def _holds(self, value: Any) -> bool:
        """True when ``value`` is an array whose memory lies in this array's storage."""
        if not isinstance(value, np.ndarray) or self._recording is None:
            return False
        at = address(value)
        return self._base_ptr <= at < self._end_ptr or (value.size == 0 and at == self._end_ptr)

    # -- item access -----------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        plain_key = plain(key)
        np.ndarray.__setitem__(self.view(np.ndarray), plain_key, plain(value))
        read_all(value, "ndarray.__setitem__")  # recorded once done (an error records none)
        read_all(key, "ndarray.__setitem__")
        self._note("ndarray.__setitem__", True, plain_key)

    def __getitem__(self, key: Any) -> Any:
        read_all(key, "ndarray.__getitem__")
        key = plain(key)
        out = np.ndarray.__getitem__(self.view(np.ndarray), key)
        if isinstance(out, np.ndarray) and self._holds(out):
            view = self._adopt(out)  # a view: reads nothing yet, unless NumPy is about to
            if self._watched():  # copy it into a plain array (``plain[:n] = host[:n]``)
                stored, container = stored_into(sys._getframe(1))
                if stored and (container is None or (isinstance(container, np.ndarray)
                                                     and not isinstance(container, HostArray))):
                    view._note("ndarray.__setitem__ (into a plain array)", False)
            return view
        self._note("ndarray.__getitem__", False, key)
        return out

    def __iter__(self) -> Any:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self)))  # each item read as it is reached

    # -- NumPy's protocols -----------------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        outs = kwargs.get("out", ())
        outs = outs if isinstance(outs, tuple) else (outs,)
        if method == "at":  # ``ufunc.at(a, indices, b)``: a's indexed elements read, written
            target = inputs[0]
            if isinstance(target, HostArray):
                target._note(name, False, plain(inputs[1]))
                target._note(name, True, plain(inputs[1]))
            read_all(inputs[1:], name)
        else:
            read_all(inputs, name)
        read_all(kwargs.get("where"), name)
        for value in outs:
            if isinstance(value, HostArray):
                value._note(name, True)
        if outs:
            kwargs["out"] = tuple(plain(v) for v in outs)
        result = getattr(ufunc, method)(*(plain(v) for v in inputs), **plain(kwargs))
        if outs and method != "at":  # NumPy hands back the ``out`` arrays themselves
            return outs[0] if len(outs) == 1 else outs
        return result

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        if func is np.take and args and isinstance(args[0], HostArray):
            return args[0].take(*args[1:], **kwargs)  # only the elements taken are read
        name = f"np.{func.__name__}"
        written = _written_by(func, args, kwargs)
        outs = kwargs.get("out")
        for array, mask in written:
            array._note(name, True, _ALL if mask is None else mask)
        for value in outs if isinstance(outs, tuple | list) else (outs,):
            if isinstance(value, HostArray):
                value._note(name, True)
        skip = {id(a) for a, _ in written} | {id(v) for v in host_arrays_in(outs)}
        sources = [a for a in host_arrays_in((args, kwargs)) if id(a) not in skip]
        plain_kwargs = plain(kwargs)
        result = func(*plain(args), **plain_kwargs)
        if isinstance(outs, HostArray) and result is plain_kwargs.get("out"):
            result = outs  # NumPy hands back ``out`` itself
        result, viewed = rewrap(result, sources)
        if func not in _READS_NOTHING:
            for array in sources:
                if id(array) not in viewed:
                    array._note(name, False)
        return result

    def __reduce__(self) -> Any:  # pickling reads the data; it unpickles as a plain array
        self._note("ndarray.__reduce__", False)
        return self.view(np.ndarray).__reduce__()

    def __reduce_ex__(self, protocol: Any) -> Any:
        self._note("ndarray.__reduce_ex__", False)
        return self.view(np.ndarray).__reduce_ex__(protocol)


# NumPy functions that read no element of their array arguments (shape, dtype, memory).
_READS_NOTHING = {np.shape, np.ndim, np.size, np.empty_like, np.zeros_like, np.ones_like,
                  np.full_like, np.shares_memory, np.may_share_memory, np.result_type,
                  np.iscomplexobj, np.isrealobj}


def _written_by(func: Any, args: tuple, kwargs: dict) -> list[tuple[HostArray, Any]]:
    """The watched arrays ``func`` writes in place (its first argument), each with the mask of
    the elements written (None: all)."""
    target = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(target, HostArray):
        return []

    def arg(position: int, key: str, default: Any = None) -> Any:
        return plain(args[position] if len(args) > position else kwargs.get(key, default))
    shape = target.shape
    if func is np.copyto:
        where = arg(3, "where", True)
        return [(target, None if where is True else np.broadcast_to(where, shape))]
    if func is np.put:
        return [(target, put_probe(target, args, kwargs))]
    if func is np.place:
        return [(target, np.broadcast_to(np.asarray(arg(1, "mask"), dtype=bool), shape))]
    if func is np.putmask:
        return [(target, np.broadcast_to(np.asarray(arg(1, "mask"), dtype=bool), shape))]
    if func is np.put_along_axis:
        probe = np.zeros(shape, dtype=bool)
        np.put_along_axis(probe, arg(1, "indices"), True, arg(3, "axis"))
        return [(target, probe)]
    if func is np.fill_diagonal:
        probe = np.zeros(shape, dtype=bool)
        np.fill_diagonal(probe, True, wrap=bool(arg(2, "wrap", False)))
        return [(target, probe)]
    return []


# -- helpers shared by the hooks ------------------------------------------------------------
_NESTING = (HostArray, list, tuple, dict)


def host_arrays_in(value: Any, depth: int = 4) -> list[HostArray]:
    """The ``HostArray`` objects in ``value`` and the lists, tuples and dict values it nests."""
    if isinstance(value, HostArray):
        return [value]
    if depth == 0 or not isinstance(value, list | tuple | dict):
        return []
    items = value.values() if isinstance(value, dict) else value
    if not any(issubclass(kind, _NESTING) for kind in set(map(type, items))):
        return []  # the common case, a list of numbers: its few types checked
    return [a for item in items for a in host_arrays_in(item, depth - 1)]


def read_all(value: Any, name: str) -> None:
    """Every ``HostArray`` in ``value`` is read whole (a source, an index, a mask)."""
    for array in host_arrays_in(value):
        array._note(name, False)


def plain(value: Any) -> Any:
    """``value`` with every ``HostArray`` in it (nested in lists, tuples, dicts) a plain
    ndarray view of the same memory: what NumPy and torch are handed, so results are plain."""
    if isinstance(value, HostArray):
        return value.view(np.ndarray)
    if isinstance(value, list | tuple) and host_arrays_in(value):
        converted = [plain(v) for v in value]
        return type(value)(converted) if isinstance(value, list | tuple) else converted
    if isinstance(value, dict) and host_arrays_in(value):
        return {k: plain(v) for k, v in value.items()}
    return value


def rewrap(result: Any, sources: list[HostArray]) -> tuple[Any, set[int]]:
    """``result`` with each array that views a source's memory a ``HostArray`` again, and the
    ids of the sources viewed (their elements were not read)."""
    viewed: set[int] = set()

    def one(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            for source in sources:
                if source._holds(value):
                    viewed.add(id(source))
                    return source._adopt(value)
            return value
        if isinstance(value, list | tuple):
            items = [one(v) for v in value]
            return type(value)(items) if type(value) in (list, tuple) else value
        return value
    return one(result), viewed


def put_probe(array: Any, args: tuple, kwargs: dict) -> np.ndarray:
    """Which elements of ``array`` ``np.put(array, *args[1:], **kwargs)`` writes."""
    probe = np.zeros(array.shape, dtype=bool)
    np.put(probe, plain(args[1] if len(args) > 1 else kwargs["ind"]), True,
           mode=args[3] if len(args) > 3 else kwargs.get("mode", "raise"))
    return probe


# Methods NumPy runs in C that read the array's elements (a view result reads nothing).
