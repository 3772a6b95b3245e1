"""Property test: every NumPy access form of watched pinned memory records exactly the
elements it touches (form x slice x direction), against a reference that never runs the
recorder: the form runs on a plain NumPy buffer, and

- the elements it *writes* are those whose value changed (the buffer holds distinct values
  that no form writes);
- the elements it *reads* are those whose perturbation (NaN, +huge, -huge, one element at a
  time) changes the form's result.

The recorder's side is what the watched run handed the detector: the host accesses of the
pinned buffer (a spy on ``Recording.op``), and its result must be a plain value."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from overlap_harness.model.trace import OpKind
from overlap_harness.recorder import watch
from overlap_harness.recorder.host_arrays import HostArray

SIZE = 12
Form = Callable[[np.ndarray, torch.Tensor, slice], Any]

# Reads: the form's result depends on the elements it read. ``a`` is the whole buffer (a
# HostArray under the recorder), ``t`` a tensor over the same memory, ``sl`` the slice.
READS: dict[str, Form] = {
    "np.array": lambda a, t, sl: np.array(a[sl]),
    "np.asarray then sum": lambda a, t, sl: np.asarray(a[sl]).sum(),
    "np.ascontiguousarray": lambda a, t, sl: np.ascontiguousarray(a[sl]).tolist(),
    "np.copyto into plain": lambda a, t, sl: _copied_into_plain(a[sl]),
    "slice into second buffer": lambda a, t, sl: _assigned_into(a[sl]),
    "slice into a plain array": lambda a, t, sl: _assigned_into_plain(a, sl),
    "tobytes": lambda a, t, sl: a[sl].tobytes(),
    "tolist": lambda a, t, sl: a[sl].tolist(),
    "iteration": lambda a, t, sl: [float(x) for x in a[sl]],
    "np.sum": lambda a, t, sl: np.sum(a[sl]),
    "max method": lambda a, t, sl: a[sl].max(),
    "np.min": lambda a, t, sl: np.min(a[sl]),
    "argmax": lambda a, t, sl: _argmax_and_value(a[sl]),
    "cumsum": lambda a, t, sl: a[sl].cumsum(),
    "np.sort": lambda a, t, sl: np.sort(a[sl]),
    "ufunc": lambda a, t, sl: a[sl] * 2,
    "comparison": lambda a, t, sl: a[sl] > 5,
    "np.concatenate": lambda a, t, sl: np.concatenate([a[sl], a[sl][:1]]),
    "first item": lambda a, t, sl: float(a[sl][0]) if a[sl].size else None,
    "last item via item()": lambda a, t, sl: a[sl][-1:].item() if a[sl].size else None,
    "item(i)": lambda a, t, sl: a[sl].item(1) if a[sl].size > 1 else None,
    "take": lambda a, t, sl: a[sl].take([0, -1]) if a[sl].size else None,
    "np.take": lambda a, t, sl: np.take(a[sl], [-1]) if a[sl].size else None,
    "fancy index": lambda a, t, sl: a[sl][[0, -1]] if a[sl].size else None,
    "boolean mask": lambda a, t, sl: a[sl][np.arange(a[sl].size) % 2 == 0],
    "str": lambda a, t, sl: str(a[sl]),
    "pickle": lambda a, t, sl: pickle.loads(pickle.dumps(a[sl])),
    "copy method": lambda a, t, sl: a[sl].copy(),
    "astype": lambda a, t, sl: a[sl].astype(np.float32),
    "torch.tensor": lambda a, t, sl: torch.tensor(a[sl]),
    "reshape view then sum": lambda a, t, sl: a[sl].reshape(-1, 1).sum(),
    "np.asarray of the tensor": lambda a, t, sl: np.asarray(t[sl]).max(),
    "torch.from_numpy then sum": lambda a, t, sl: torch.from_numpy(a[sl]).sum(),
    "plain array <- tensor slice": lambda a, t, sl: _tensor_into_plain(t, sl),
    "second buffer <- tensor slice": lambda a, t, sl: _tensor_into_second(t, sl),
    "tensor <- torch.as_tensor of a slice": lambda a, t, sl: torch.zeros(SIZE, dtype=t.dtype)[
        :len(range(*sl.indices(SIZE)))].copy_(torch.as_tensor(a[sl])),
}
TORCH_SLICED = {"np.asarray of the tensor", "torch.from_numpy then sum",  # positive steps
                "plain array <- tensor slice", "second buffer <- tensor slice",
                "tensor <- torch.as_tensor of a slice"}

# Writes: each writes values no buffer element holds (the buffer holds 1000 + i).
WRITES: dict[str, Form] = {
    "setitem scalar": lambda a, t, sl: a.__setitem__(sl, -1.0),
    "setitem from plain": lambda a, t, sl: a.__setitem__(sl, -np.arange(a[sl].size) - 1.0),
    "setitem into a view": lambda a, t, sl: a[sl].__setitem__(slice(None), -5.0),
    "np.copyto": lambda a, t, sl: np.copyto(a[sl], -2.0),
    "np.copyto where": lambda a, t, sl: np.copyto(a[sl], -2.0,
                                                  where=np.arange(a[sl].size) % 2 == 1),
    "fill": lambda a, t, sl: a[sl].fill(-3.0),
    "ufunc out": lambda a, t, sl: np.negative(a[sl], out=a[sl]),
    "np.cumsum out": lambda a, t, sl: np.cumsum(np.ones(a[sl].size), out=a[sl]),
    "in-place add": lambda a, t, sl: _iadd(a[sl]),
    "np.put": lambda a, t, sl: np.put(a[sl], [0], -4.0) if a[sl].size else None,
    "ufunc.at": lambda a, t, sl: np.subtract.at(a[sl], [-1], 5000.0) if a[sl].size else None,
    "boolean mask write": lambda a, t, sl: a[sl].__setitem__(
        np.arange(a[sl].size) % 3 == 0, -6.0),
    "fancy write": lambda a, t, sl: a[sl].__setitem__([0, -1], -7.0) if a[sl].size else None,
    "np.asarray of the tensor, written": lambda a, t, sl: np.asarray(t[sl]).__setitem__(
        slice(None), -8.0),
    "tensor <- torch.from_numpy": lambda a, t, sl: t[sl].copy_(
        torch.from_numpy(-np.arange(len(range(*sl.indices(SIZE)))) - 9.0)),
}


def _argmax_and_value(v: np.ndarray) -> tuple[int, float]:
    """``argmax`` and the value there (of one element, argmax alone depends on no value)."""
    at = int(v.argmax())
    return at, float(v[at])


def _copied_into_plain(v: np.ndarray) -> np.ndarray:
    out = np.zeros(v.shape)
    np.copyto(out, v)
    return out


def _assigned_into(v: np.ndarray) -> np.ndarray:
    """``dst[:n] = src[:n]`` with ``dst`` a second buffer of the same kind as the source's."""
    dst = SECOND[0]
    dst[:v.size] = v
    return dst[:v.size].view(np.ndarray).copy()


def _assigned_into_plain(a: np.ndarray, sl: slice) -> np.ndarray:
    """``plain[:n] = src[sl]``: NumPy's C copy, seen from the statement."""
    plain = np.zeros(SIZE)
    n = len(range(*sl.indices(SIZE)))
    plain[:n] = a[sl]
    return plain


def _tensor_into_plain(t: torch.Tensor, sl: slice) -> np.ndarray:
    """``plain[:n] = tensor[sl]``: NumPy asks the tensor for its array."""
    plain = np.zeros(SIZE)
    n = len(range(*sl.indices(SIZE)))
    plain[:n] = t[sl]
    return plain


def _tensor_into_second(t: torch.Tensor, sl: slice) -> np.ndarray:
    n = len(range(*sl.indices(SIZE)))
    SECOND[0][:n] = t[sl]
    return SECOND[0][:n].view(np.ndarray).copy()


def _iadd(v: np.ndarray) -> None:
    v += 100000.0


SECOND: list[np.ndarray] = []  # the second buffer the slice-assignment form writes into


def _outcome(form: Form, a: np.ndarray, t: torch.Tensor, sl: slice) -> Any:
    """The form's result, or the type of the error it raised (``argmax`` of an empty slice):
    both sides compare the same."""
    try:
        return form(a, t, sl)
    except (ValueError, IndexError) as exc:
        return type(exc).__name__


def _fresh(shape: tuple[int, ...] = (SIZE,)) -> np.ndarray:
    return 1000.0 + np.arange(SIZE, dtype=np.float64).reshape(shape)


def _canonical(value: Any) -> bytes:
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray | np.generic):
        return pickle.dumps((np.asarray(value).dtype.str, np.asarray(value).shape,
                             np.asarray(value).tobytes()))
    return pickle.dumps(value)


def _reference(form: Form, sl: Any, reads: bool, shape: tuple[int, ...] = (SIZE,)) -> set[int]:
    """The elements ``form`` reads (or writes), observed on plain buffers."""
    def run(buffer: np.ndarray) -> Any:
        SECOND[:] = [np.zeros(SIZE)]
        return _outcome(form, buffer, torch.from_numpy(buffer), sl)
    if not reads:
        buffer = _fresh(shape)
        run(buffer)
        return {int(i) for i in np.flatnonzero(buffer != _fresh(shape))}
    baseline = _canonical(run(_fresh(shape)))
    read = set()
    for i in range(SIZE):
        for poison in (np.nan, 1e9, -1e9):
            buffer = _fresh(shape)
            buffer.reshape(-1)[i] = poison
            if _canonical(run(buffer)) != baseline:
                read.add(i)
                break
    return read


def _recorded(form: Form, sl: Any,
              shape: tuple[int, ...] = (SIZE,)) -> tuple[set[int], set[int], Any]:
    """The elements of the pinned buffer the recorder saw read and written, and the result."""
    seen: dict[bool, set[int]] = {False: set(), True: set()}
    with watch("cpu") as w:
        pinned = torch.tensor(_fresh(shape), pin_memory=True)
        second = torch.zeros(SIZE, dtype=torch.float64, pin_memory=True)
        host = pinned.numpy()
        SECOND[:] = [second.numpy()]
        original = w.recording.op

        def spy(name: str, agent: int, accesses: Any, kind: OpKind, *args: Any,
                **kwargs: Any) -> Any:
            if kind in (OpKind.HOST_READ, OpKind.HOST_WRITE):
                for access in accesses:
                    if access.info.name.startswith("pinned@"):
                        seen[access.write].update(int(e) for e in access.elements)
            return original(name, agent, accesses, kind, *args, **kwargs)
        w.recording.op = spy
        result = _outcome(form, host, pinned, sl)
        assert w.unknown_ops == []
    return seen[False], seen[True], result


slices = st.builds(slice, st.none() | st.integers(-SIZE - 2, SIZE + 2),
                   st.none() | st.integers(-SIZE - 2, SIZE + 2),
                   st.none() | st.sampled_from([1, 2, 3, -1, -2]))
FORMS = settings(derandomize=True, deadline=None, max_examples=150,
                 suppress_health_check=[HealthCheck.too_slow])


@FORMS
@given(name=st.sampled_from(sorted(READS)), sl=slices)
def test_reads_record_exactly_the_elements_read(name: str, sl: slice) -> None:
    if name in TORCH_SLICED:
        assume(sl.step is None or sl.step > 0)
    reads, writes, result = _recorded(READS[name], sl)
    assert result == _outcome(READS[name], _fresh(), torch.from_numpy(_fresh()), sl) if \
        isinstance(result, str) else True  # an error on one side is the error on both
    assert reads == _reference(READS[name], sl, reads=True)
    assert writes == set()
    assert not isinstance(result, HostArray)  # the program gets plain values


@FORMS
@given(name=st.sampled_from(sorted(WRITES)), sl=slices)
def test_writes_record_exactly_the_elements_written(name: str, sl: slice) -> None:
    if name in TORCH_SLICED or "tensor" in name:
        assume(sl.step is None or sl.step > 0)
    _, writes, _ = _recorded(WRITES[name], sl)
    assert writes == _reference(WRITES[name], sl, reads=False)


def test_every_form_is_drawn_and_touches_something():
    """The forms are not vacuous: on the whole buffer each reads or writes every element."""
    whole = slice(None)
    for name, form in READS.items():
        assert _reference(form, whole, reads=True), name
    for name, form in WRITES.items():
        assert _reference(form, whole, reads=False), name


# Two dimensions: strides of rows and columns, transposes, row iteration.
SHAPE_2D = (4, 3)
READS_2D: dict[str, Form] = {
    "np.array": lambda a, t, sl: np.array(a[sl]),
    "tobytes": lambda a, t, sl: a[sl].tobytes(),
    "tolist": lambda a, t, sl: a[sl].tolist(),
    "row iteration": lambda a, t, sl: [row.tolist() for row in a[sl]],
    "np.sum over columns": lambda a, t, sl: np.sum(a[sl], axis=0),
    "transposed then copied": lambda a, t, sl: a[sl].T.copy(),
    "ufunc": lambda a, t, sl: a[sl] + 1,
    "flatten": lambda a, t, sl: a[sl].flatten(),
    "item((i, j))": lambda a, t, sl: a[sl].item((0, -1)) if a[sl].size else None,
    "take along columns": lambda a, t, sl: a[sl].take([0], axis=1) if a[sl].size else None,
    "first row via np.asarray": lambda a, t, sl: np.asarray(a[sl])[:1].tolist(),
}
WRITES_2D: dict[str, Form] = {
    "setitem scalar": lambda a, t, sl: a.__setitem__(sl, -1.0),
    "transposed write": lambda a, t, sl: a[sl].T.__setitem__(Ellipsis, -2.0),
    "first column": lambda a, t, sl: a[sl].__setitem__((Ellipsis, 0), -3.0),
    "np.copyto": lambda a, t, sl: np.copyto(a[sl], -4.0),
}
axis_slices = st.builds(slice, st.none() | st.integers(-5, 5), st.none() | st.integers(-5, 5),
                        st.none() | st.sampled_from([1, 2, -1]))


@FORMS
@given(name=st.sampled_from(sorted(READS_2D)), rows=axis_slices, columns=axis_slices)
def test_two_dimensional_reads(name: str, rows: slice, columns: slice) -> None:
    reads, writes, _ = _recorded(READS_2D[name], (rows, columns), SHAPE_2D)
    assert reads == _reference(READS_2D[name], (rows, columns), True, SHAPE_2D)
    assert writes == set()


@FORMS
@given(name=st.sampled_from(sorted(WRITES_2D)), rows=axis_slices, columns=axis_slices)
def test_two_dimensional_writes(name: str, rows: slice, columns: slice) -> None:
    _, writes, _ = _recorded(WRITES_2D[name], (rows, columns), SHAPE_2D)
    assert writes == _reference(WRITES_2D[name], (rows, columns), False, SHAPE_2D)
