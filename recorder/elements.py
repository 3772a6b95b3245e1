"""Element-precise read and write sets of one aten op.

What an op reads and writes comes from its schema: an argument whose alias annotation says
``!`` (``Tensor(a!) self``) is written, every other tensor argument is read, and a return that
aliases no argument is a fresh tensor the op writes. Which elements: a tensor is a view of a
storage, so the elements it names are ``storage_offset + sum(index_d * stride_d)`` over its
sizes (STREAM-SEMANTICS.md "Views": two views with different offsets conflict exactly where
they overlap). Ops that index (``index``, ``index_put_``, ``index_select``, ``gather``,
``scatter_``, ``index_copy_``, ...) touch only the rows their index values name: the same op
is applied to a tensor of element ids in place of the data, which gives exactly those ids.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from overlap_harness.recorder.own_work import recorder_work

aten = torch.ops.aten


def element_ids(t: torch.Tensor) -> np.ndarray:
    """Flat element ids (in the tensor's own element size) of the storage that ``t`` names."""
    numel = t.numel()
    offset = t.storage_offset()
    if numel == 0:
        return np.empty(0, dtype=np.int64)
    if t.is_contiguous():
        return np.arange(offset, offset + numel, dtype=np.int64)
    ids = np.full((1,), offset, dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        ids = (ids[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).reshape(-1)
    if 0 in t.stride():  # an expanded view names some elements more than once
        ids = np.unique(ids)
    return ids


def to_storage_elements(ids: np.ndarray, itemsize: int, storage_itemsize: int) -> np.ndarray:
    """Element ids in a view's element size, converted to the storage's (a view through
    another dtype: every storage element one of its bytes falls in)."""
    if itemsize == storage_itemsize:
        return ids
    start = ids * itemsize // storage_itemsize
    end = ((ids + 1) * itemsize - 1) // storage_itemsize
    span = int((end - start).max()) + 1 if ids.size else 1
    covered = start[:, None] + np.arange(span, dtype=np.int64)[None, :]
    return np.unique(covered[covered <= end[:, None]])


def _id_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor shaped like ``t`` holding the element id of each of its elements."""
    ids = element_ids(t) if t.is_contiguous() else _dense_ids(t)
    return torch.from_numpy(ids).reshape(t.shape)


def _dense_ids(t: torch.Tensor) -> np.ndarray:
    """Like :func:`element_ids` but one id per element of ``t`` (repeats kept)."""
    ids = np.full((1,), t.storage_offset(), dtype=np.int64)
    for size, stride in zip(t.shape, t.stride(), strict=True):
        ids = (ids[:, None] + np.arange(size, dtype=np.int64)[None, :] * stride).reshape(-1)
    return ids


def _cpu(value: Any) -> Any:
    """Index values on the CPU (a no-op in CPU mode; a blocking copy on a GPU)."""
    if isinstance(value, torch.Tensor):
        with recorder_work():  # a blocking copy on a GPU: not the program's sync
            return value.cpu()
    if isinstance(value, list | tuple):
        return type(value)(_cpu(v) for v in value)
    return value


def _selected(ids: torch.Tensor) -> np.ndarray:
    return np.unique(ids.reshape(-1).numpy())


# How each indexing op picks elements of its first argument: (ids, args, kwargs) -> ids.
_Picker = Callable[[torch.Tensor, tuple, dict], torch.Tensor]


def _pick_index(ids: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    return aten.index.Tensor(ids, _cpu(args[1]))


def _pick_index_select(ids: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    return aten.index_select.default(ids, args[1], _cpu(args[2]))


def _pick_gather(ids: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    return aten.gather.default(ids, args[1], _cpu(args[2]))


def _pick_mask(ids: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    return ids[_cpu(args[1]).expand(ids.shape)]


_INDEX_READS: dict[Any, _Picker] = {
    aten.index.Tensor: _pick_index,
    aten.index_select.default: _pick_index_select,
    aten.gather.default: _pick_gather,
}
# In-place ops that write only the picked elements of their first argument; the ``bool``
# says whether they also read them (an accumulate).
_INDEX_WRITES: dict[Any, tuple[_Picker, bool]] = {
    aten.index_put_.default: (_pick_index, False),
    aten._index_put_impl_.default: (_pick_index, False),
    aten.index_copy_.default: (_pick_index_select, False),
    aten.index_fill_.int_Scalar: (_pick_index_select, False),
    aten.index_fill_.int_Tensor: (_pick_index_select, False),
    aten.index_add_.default: (_pick_index_select, True),
    aten.scatter_.src: (_pick_gather, False),
    aten.scatter_.value: (_pick_gather, False),
    aten.scatter_.reduce: (_pick_gather, True),
    aten.scatter_.value_reduce: (_pick_gather, True),
    aten.scatter_add_.default: (_pick_gather, True),
    aten.scatter_reduce_.two: (_pick_gather, True),
    aten.masked_fill_.Scalar: (_pick_mask, False),
    aten.masked_fill_.Tensor: (_pick_mask, False),
}


def _accumulates(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in (aten.index_put_.default, aten._index_put_impl_.default):
        return bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    return _INDEX_WRITES[func][1]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


@functools.cache
def schema_arguments(func: Any) -> tuple[tuple[int, str, bool, bool], ...]:
    """Per argument of an aten op's schema: (position, name, keyword-only, written), read
    from the schema once per op (each field of a schema argument is a C++ property that
    builds a new object per read; the recorder asks for every op it sees)."""
    return tuple((index, arg.name, arg.kwarg_only,
                  arg.alias_info is not None and arg.alias_info.is_write)
                 for index, arg in enumerate(func._schema.arguments))


@functools.cache
def fresh_returns(func: Any) -> tuple[bool, ...]:
    """Per return of an aten op's schema: True when it aliases no argument (a fresh
    tensor), read from the schema once per op."""
    return tuple(ret.alias_info is None for ret in func._schema.returns)


def schema_accesses(func: Any, args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, bool]]:
    """``(tensor, write)`` for every tensor argument of an aten op call, by its schema."""
    return arguments_accessed(schema_arguments(func), args, kwargs)


def arguments_accessed(arguments: tuple[tuple[int, str, bool, bool], ...], args: tuple,
                       kwargs: dict) -> list[tuple[torch.Tensor, bool]]:
    """:func:`schema_accesses` with the op's :func:`schema_arguments` already at hand."""
    out: list[tuple[torch.Tensor, bool]] = []
    count = len(args)
    for index, name, kwarg_only, write in arguments:
        value = args[index] if not kwarg_only and index < count else kwargs.get(name)
        if value is None:
            continue
        for t in _tensors(value):
            out.append((t, write))
    return out


@functools.cache
def is_view_or_metadata(func: Any) -> bool:
    """True for ops that touch no memory: every return aliases an argument and nothing is
    written (views such as ``slice``, ``view``, ``t``), or returns no tensor at all while
    writing nothing (``sym_size``)."""
    schema = func._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    returns = schema.returns
    return all(r.alias_info is not None for r in returns) and bool(returns)


def is_indexing(func: Any) -> bool:
    """True for the ops whose elements their index values pick (:func:`index_elements`)."""
    return func in _INDEX_READS or func in _INDEX_WRITES


def index_elements(func: Any, args: tuple, kwargs: dict) -> tuple[np.ndarray, bool, bool] | None:
    """For an indexing op: (element ids of the first argument it touches, read, write) in
    that tensor's element size; None for any other op."""
    if func in _INDEX_READS:
        return _selected(_INDEX_READS[func](_id_tensor(args[0]), args, kwargs)), True, False
    if func in _INDEX_WRITES:
        picked = _selected(_INDEX_WRITES[func][0](_id_tensor(args[0]), args, kwargs))
        return picked, _accumulates(func, args, kwargs), True
    return None


def row_elements(t: torch.Tensor, rows: torch.Tensor) -> np.ndarray:
    """Element ids of the rows ``rows`` (of dim 0) of ``t``."""
    return _selected(aten.index_select.default(_id_tensor(t), 0, _cpu(rows).reshape(-1)))
