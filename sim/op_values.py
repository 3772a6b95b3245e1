"""The value side of a simulated op: one engine event that snapshots the op's reads and runs
its function at the op's start, and one entry in the device's heap of landings that lands its
writes at its end (:class:`OpValues`), and
the scatter checks the device uses to flag device-defined values (:func:`may_repeat`,
:func:`repeats`, :class:`RepeatCheck`). Split from :mod:`overlap_harness.sim.sim_device`,
which schedules these.

A snapshot is taken only where it can be seen: an input the function's code never reads gets
the live memory (:mod:`overlap_harness.sim.fn_inputs`), and the device's own copy function
reads just the elements it selects (:class:`SelectionCopy`); every function still computes
from its inputs as they were at the op's start."""

from __future__ import annotations

from heapq import heappop, heappush
from typing import TYPE_CHECKING

import numpy as np
import torch

from overlap_harness.model.detector import AccessRow, NodeRow
from overlap_harness.model.device import Buffer, OpFn, Sel, torch_sel
from overlap_harness.sim.fn_inputs import unread_inputs

if TYPE_CHECKING:  # the device owns its op values; typing only
    from overlap_harness.sim.sim_device import SimDevice


def may_repeat(sel: Sel) -> bool:
    """Can ``buf[sel]`` name an element twice? Not for basic indexing (all, an int, a slice,
    a tuple of those): only index arrays can."""
    if type(sel) is np.ndarray:  # the usual index set, first
        return True
    if sel is None or isinstance(sel, (int, slice)):
        return False
    if isinstance(sel, tuple):
        return any(may_repeat(s) for s in sel)
    return True


def repeats(e: np.ndarray) -> bool:
    """Does the element-id array ``e`` name some element twice? A set for small arrays
    (``np.unique`` costs microseconds however small its input), ``np.unique`` for large."""
    if e.size <= 1:
        return False
    if e.size <= 256:
        return len(set(e.tolist())) != e.size
    return np.unique(e).size != e.size


class SelectionCopy:
    """The function of a copy from ``src[sel]``: ``v[sel]`` of the source's snapshot.

    The value engine reads a list, an array or a forward slice selection straight from the
    source's memory instead (:meth:`read`): a private array of the selected elements, without
    copying the whole buffer first. numpy indexing gives what torch indexing of the snapshot
    gives (the same elements, shape and dtype; a list or array as the int64 index array
    ``torch_sel`` makes of it, as :func:`_observed` does); a slice of numpy is a view, so it is
    copied. Anything else (an int, a tuple, a tensor, a slice torch refuses) runs this
    function on a snapshot as before."""

    __slots__ = ("sel",)

    def __init__(self, sel: Sel) -> None:
        self.sel = sel

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        return value[torch_sel(self.sel, "cpu")]

    def read(self, source: np.ndarray) -> torch.Tensor | None:
        """``source[sel]`` as a private tensor, or None where the snapshot path must run."""
        sel = self.sel
        kind = type(sel)
        if kind is list or kind is np.ndarray:
            return torch.from_numpy(source[np.asarray(sel, dtype=np.int64)])
        if kind is slice and (sel.step is None or sel.step > 0):
            return torch.from_numpy(source[sel].copy())
        return None


class RepeatCheck:
    """:func:`repeats` for the element ids of one device's blocks (``0 <= id < numel`` of the
    largest block :meth:`reserve` was told of), in time linear in the ids: each id's slot in a
    scratch array gets its position, and the ids repeat exactly when reading the slots back
    does not give every position (two equal ids read the same slot, so one of them misses
    its own). A set stays cheaper for a few ids.

    The positions ``0..n-1`` of each length up to :data:`_PREFIXES_KEPT` asked for so far are
    kept as views of one ``arange`` (slicing anew costs a third of the check), so a check is a
    scatter, a gather and a byte comparison."""

    __slots__ = ("_positions", "_prefixes", "_slots")

    def __init__(self) -> None:
        self._slots = np.zeros(0, dtype=np.int64)
        self._positions = np.arange(0, dtype=np.int64)
        self._prefixes: list[np.ndarray] = []  # by n: ``_positions[:n]``

    def reserve(self, numel: int) -> None:
        """Make room for the ids of a block of ``numel`` elements."""
        if numel > self._slots.size:
            self._slots = np.zeros(numel, dtype=np.int64)
            self._positions = np.arange(numel, dtype=np.int64)
            self._prefixes = []

    def check(self, e: np.ndarray) -> bool:
        """Does ``e`` name some element twice? (A method, not ``__call__``: calling an
        instance takes Python's slow call path.)"""
        n = e.size
        if n <= _SET_CHECK_MAX:
            return n > 1 and len(set(e.tolist())) != n
        prefixes = self._prefixes
        if n < len(prefixes):
            positions = prefixes[n]
        elif n <= _PREFIXES_KEPT:
            positions = self._positions
            prefixes.extend([positions[:k] for k in range(len(prefixes), n + 1)])
            positions = prefixes[n]
        else:
            positions = self._positions[:n]
        slots = self._slots
        slots[e] = positions
        return slots[e].tobytes() != positions.tobytes()


# up to this many ids a set is cheaper than the scatter and gather (measured: 0.3-0.45 µs
# against 0.45-0.55 µs at 4-8 ids; 1.5 µs against 0.45 µs at 40)
_SET_CHECK_MAX = 8
_PREFIXES_KEPT = 1024  # views kept by RepeatCheck (a longer write slices its positions)


def numpy_view(view: torch.Tensor) -> np.ndarray | None:
    """``view``'s memory as a numpy array (shared, not copied), or None for a dtype numpy
    lacks (bfloat16 and the other torch-only types)."""
    try:
        return view.numpy()
    except TypeError:
        return None


def _observed(snap: torch.Tensor, sel: Sel) -> torch.Tensor:
    """``snap[sel]``, what an observing op read. A list or an array (the protocol's usual
    selections) becomes the int64 index array ``torch_sel`` makes of it and is applied by
    numpy to the snapshot's memory (``numpy()`` shares it), under half the cost of building
    an index tensor for torch; integer-array indexing is the same in both (the same elements
    in the same shape, negative ids from the end, a new contiguous array). A tuple, a slice or
    a tensor, and a dtype numpy lacks, go through torch as before."""
    if sel is None:
        return snap
    kind = type(sel)
    if (kind is list or kind is np.ndarray) and snap.dtype in _NUMPY_DTYPES:
        return torch.from_numpy(snap.numpy()[np.asarray(sel, dtype=np.int64)])
    return snap[torch_sel(sel, "cpu")]


def _snapshot(view: torch.Tensor, source: np.ndarray | None) -> torch.Tensor:
    """A private copy of a buffer's whole value: by numpy where the dtype allows
    (``torch.from_numpy`` of a copy: the same values, dtype, shape and strides as
    ``clone()``, at about half its cost), by ``clone()`` otherwise (``source`` None)."""
    return view.clone() if source is None else torch.from_numpy(source.copy())


_NDARRAY = np.ndarray  # the types the value engine tests for, one global load each
_TENSOR = torch.Tensor

# the torch dtypes whose tensors have a numpy view (bfloat16 and the other torch-only ones lack
# one); sim_device.numpy_view makes the same test by trying
_NUMPY_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32,
                           torch.int64, torch.float16, torch.float32, torch.float64})


# The order of the value phases. Writes land before reads at one instant, and among
# equal-time writes (or reads) issue order decides: the order of two simpy events per op made
# at issue (URGENT ends, NORMAL starts, both created in issue order). An op's start is a simpy
# event of priority ``_START_PRIORITY + op`` (simpy orders by time, then priority); its end is
# no simpy event but an entry ``(end, op, values)`` in the device's heap of landings, which
# every start drains up to its own time before it reads (ends at its instant included) and
# the host drains up to its clock before it reads memory. So the phases keep that order, and
# an op costs one simpy event (its schedule and its step are Python calls; the landing heap's
# are two C calls).
_START_PRIORITY = 1 << 62  # above every op id


class OpValues:
    """The value side of one op: at its start (its one simpy event) the reads are snapshot
    and the function runs; at its end (its entry in the device's landing heap) the writes
    land. A zero-length op with writes has no start event: its landing entry runs it (the
    end of an instant comes before its starts).

    Built once per op on the issue path, so it keeps only what the two phases read: the
    device, the detector's row of the op (its id, name, iteration, start and end time are
    there), the function, the declared ``(buffer, sel)`` pairs of the writes, the access
    rows, the observation's name and read pairs (None without one) and whether a write
    repeats an element. It is simpy's event as ``Environment.step`` reads one and no more (a
    slotted object, not a :class:`simpy.Event`, so an op costs one object and no attribute
    dict): ``callbacks`` is a shared tuple (``step`` only iterates it and then sets it to
    None), and the triggered, successful state (``_ok``, ``_value``) is a class attribute, as
    the value engine never fails an event (an exception of the op's function propagates from
    ``step``)."""

    __slots__ = ("callbacks", "dev", "fn", "observe", "out", "repeated", "row", "rq", "wq",
                 "writes")

    _ok = True
    _value = None

    def __init__(self, dev: SimDevice, row: NodeRow, fn: OpFn,
                 writes: list[tuple[Buffer, Sel]],
                 observe: tuple[str, list[tuple[Buffer, Sel]]] | None,
                 rq: tuple[AccessRow, ...], wq: tuple[AccessRow, ...],
                 repeated: bool = False) -> None:
        self.dev = dev
        self.row = row
        self.fn = fn
        self.writes = writes
        self.observe = observe  # (name, read pairs) of an observing op
        self.rq = rq
        self.wq = wq
        self.repeated = repeated  # a write names an element twice: lands through torch
        self.out: tuple | None = None  # the function's results, once it ran

    def schedule(self, start_ns: int, end_ns: int) -> None:
        """Put the op's first phase in the engine: its start, or, when it has no length, its
        landing (which runs it)."""
        if end_ns == start_ns and self.writes:
            heappush(self.dev._landings, (end_ns, self.row[0], self))
        else:
            env = self.dev.env
            self.callbacks = _AT_START
            env.schedule(self, _START_PRIORITY + self.row[0], start_ns - env.now)

    def _on_start(self) -> None:
        row = self.row
        landings = self.dev._landings
        start = row[8]
        while landings and landings[0][0] <= start:  # what ends by this start lands first
            heappop(landings)[2].land()
        self.run()
        if self.writes:
            heappush(landings, (row[9], row[0], self))

    def run(self) -> None:
        """Snapshot the reads and run the function (the op's start).

        A snapshot is a private copy of the buffer's whole value (:func:`_snapshot`). An input
        the function's code never reads (:func:`~overlap_harness.sim.fn_inputs.unread_inputs`:
        a read declared only to order the op) gets the buffer's live memory instead: the
        function cannot see, change or keep it, so its results are the same. An observing op
        copies every input (its observations are taken from the snapshots)."""
        rq = self.rq
        fn = self.fn
        observe = self.observe
        if not rq:  # nothing to check or copy
            if observe is not None:
                self.dev.observations.setdefault((observe[0], self.row[5]), [])
            res = fn()
            self.out = res if isinstance(res, tuple) else (res,)
            return
        dev = self.dev
        blocks = dev._blocks
        for acc in rq:
            block = blocks[acc[0]]
            if not block.all_landed or block.owner != acc[1]:  # else nothing to check (usual)
                row = self.row
                dev._check_landed(row[1], row[5], rq)
                break
        views = dev._views
        np_views = dev._np_views
        if type(fn) is SelectionCopy and (source := np_views[rq[0][1]]) is not None and \
                (value := fn.read(source)) is not None:  # a copy: only what it selects
            self.out = (value,)
            return
        if observe is None:
            unread = unread_inputs(fn)
            if unread:  # the function never looks at some inputs: their live memory, no copy
                if len(rq) == 1 and unread[0]:  # one input, declared only to order the op
                    res = fn(views[rq[0][1]])
                    self.out = res if isinstance(res, tuple) else (res,)
                    return
                snaps = [views[acc[1]] if i < len(unread) and unread[i]
                         else _snapshot(views[acc[1]], np_views[acc[1]])
                         for i, acc in enumerate(rq)]
            else:
                snaps = [_snapshot(views[acc[1]], np_views[acc[1]]) for acc in rq]
        else:  # an observing op copies every input: its observations come from them
            snaps = [_snapshot(views[acc[1]], np_views[acc[1]]) for acc in rq]
            vals = [_observed(v, s) for v, (_b, s) in zip(snaps, observe[1], strict=True)]
            dev.observations.setdefault((observe[0], self.row[5]), []).extend(vals)
        res = fn(*snaps)
        self.out = res if isinstance(res, tuple) else (res,)

    def land(self) -> None:
        """Write the function's results (the op's end).

        A tensor result of the buffer's own dtype, written through an index array (or a list,
        as the int64 array ``torch_sel`` makes of it), a slice or the whole buffer, lands
        through the buffer's numpy view: the same assignment (the same
        elements, broadcasting, no conversion) at a quarter of torch indexing's cost. Anything
        else (a conversion, a tuple selection, an index set that repeats an element, whose
        winner numpy does not define) goes through torch as before. A zero-length op, which
        has no start event, runs here first."""
        if self.out is None:
            self.run()
        dev = self.dev
        dev._land(self.wq)  # the landed masks (:meth:`SimDevice._check_landed`)
        np_views = dev._np_views
        fast = not self.repeated
        writes = self.writes
        out = self.out
        if fast and len(writes) == 1 and len(out) == 1:  # the usual op: one index-array write
            b, s = writes[0]
            v = out[0]
            if type(s) is _NDARRAY and type(v) is _TENSOR and v.dtype is b.dtype and \
                    (target := np_views[b.id]) is not None:
                target[s] = v.numpy()
                return
        for (b, s), v in zip(writes, out, strict=True):
            # torch dtypes are singletons: ``is`` is their equality
            if fast and type(v) is torch.Tensor and v.dtype is b.dtype and \
                    (target := np_views[b.id]) is not None:
                kind = type(s)
                if kind is np.ndarray or kind is slice:
                    target[s] = v.numpy()
                    continue
                if s is None:
                    target[...] = v.numpy()
                    continue
                if kind is list:  # the int64 index array torch_sel would make of it
                    target[np.asarray(s, dtype=np.int64)] = v.numpy()
                    continue
            view = dev._views[b.id]
            if s is None:
                view.copy_(torch.as_tensor(v, dtype=b.dtype).expand(b.shape))
            else:
                view[torch_sel(s, "cpu")] = torch.as_tensor(v, dtype=b.dtype)


# the callback of an op's start, shared by every op's event (simpy calls it with the event)
_AT_START = (OpValues._on_start,)
