"""The dispatch mode: every aten op a watched program runs becomes a node with its accesses.

:class:`RecordingDispatchMode` sees each aten op below autograd (a
``TorchDispatchMode``), runs it, and tells the :class:`recorder.core.Recording` what it
touched: element sets from the schema and each tensor's view (:mod:`recorder.elements`), on
the current stream when device memory is involved, on the host when the op only touches
pinned host memory (a host read or write of pinned memory is a host access). A fresh output
of a device op is a new device allocation; the mode's :class:`Memory` decides where fresh
outputs live and which storages are watched, so the same mode serves the CPU mode (CUDA faked
on CPU tensors) and the GPU mode (real CUDA tensors).

Blocking host reads: ``copy_`` between host and device memory without ``non_blocking`` and
``_local_scalar_dense`` (``.item()``, ``bool(t)``) of device memory are a copy on the current
stream followed by a host sync on it (STREAM-SEMANTICS.md: a blocking D2H orders host after
copy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Protocol

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.compile_guard import skipped_by_dynamo
from overlap_harness.recorder.core import Access, Recording, StorageInfo
from overlap_harness.recorder.elements import (
    arguments_accessed,
    element_ids,
    fresh_returns,
    index_elements,
    is_view_or_metadata,
    schema_arguments,
    to_storage_elements,
)
from overlap_harness.recorder.iterations import untraced
from overlap_harness.recorder.names import Targets, label, targets_here
from overlap_harness.recorder.pageable import note_pageable_copy, refuse_pageable_copy_in_capture
from overlap_harness.recorder.per_thread import PerThread
from overlap_harness.recorder.pinned_views import reaches_host
from overlap_harness.recorder.sites import user_site

aten = torch.ops.aten

_COPY_OPS = {aten.copy_.default, aten._to_copy.default, aten._local_scalar_dense.default,
             aten.lift_fresh.default, aten.lift_fresh_copy.default}


# Ops whose output's size (or the bool they return) depends on device values: on a GPU the
# host waits for the stream to finish them (torch copies the count back and synchronizes the
# stream), so they order the host like ``.item()`` does. CPU mode must know it from the op.
_VALUE_SHAPED = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                 aten.unique_dim.default, aten.unique_consecutive.default,
                 aten.bincount.default, aten.equal.default}
# Tensor methods that read memory without an aten op the dispatcher sees (they copy to the
# host in C++): each mode's function layer records them as a host read.
HOST_READS = frozenset({"tolist", "numpy", "__array__", "__repr__", "__str__", "__format__"})

_NO_ACCESS = {aten.is_pinned.default, aten.is_same_size.default}  # metadata, no data read
# ``empty_like`` and its kin read only their first argument's shape, dtype and device;
# ``t.new_zeros(size)`` and its kin only ``t``'s dtype and device
_LIKE_OPS = {getattr(packet, overload)
             for packet in (aten.empty_like, aten.zeros_like, aten.ones_like, aten.full_like,
                            aten.rand_like, aten.randn_like, aten.randint_like,
                            aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty,
                            aten.new_empty_strided)
             for overload in packet.overloads()}
# Allocations: the fresh tensor's values are whatever the memory held, so no element is
# written (the caching allocator hands out a block, no kernel runs). Its storage is watched;
# the first kernel that fills it is its first write, so a missing wait before that kernel is
# one race, not a second one with the allocation.
_ALLOCATES = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
              aten.new_empty.default, aten.new_empty_strided.default,
              aten.empty_permuted.default}
# ``set_`` rebinds a tensor to another storage: no memory is read or written (see
# recorder.storages)
_REBINDS = {aten.set_.source_Storage, aten.set_.source_Storage_storage_offset,
            aten.set_.source_Tensor, aten.set_.default}


class _OpFacts:
    """What the dispatch layer asks of an aten op on every call, worked out once per op:
    each ``func in SET`` and each ``functools.cache`` lookup hashed the op through
    ``OpOverload.__hash__``, a Python method (about four a call; SGLang's necessity table
    dispatches over two million ops)."""

    __slots__ = ("allocates", "arguments", "copy", "fresh", "func", "like", "name", "passes",
                 "value_shaped", "view")

    def __init__(self, func: Any) -> None:
        self.func = func  # kept alive: its id stays its own while it is a key
        self.view = is_view_or_metadata(func)
        self.passes = func in _NO_ACCESS or func in _REBINDS or self.view  # nothing recorded
        self.like = func in _LIKE_OPS
        self.allocates = func in _ALLOCATES
        self.copy = func in _COPY_OPS
        self.value_shaped = func in _VALUE_SHAPED
        self.name = op_name(func)
        self.arguments = schema_arguments(func)
        self.fresh = fresh_returns(func)


_FACTS: dict[int, _OpFacts] = {}  # id(func) -> its facts (a dict keyed by the op hashes it)


def op_facts(func: Any) -> _OpFacts:
    """The :class:`_OpFacts` of ``func``, kept per op."""
    facts = _FACTS.get(id(func))
    if facts is None or facts.func is not func:
        facts = _FACTS[id(func)] = _OpFacts(func)
    return facts


class Placement(StrEnum):
    """Where the fresh outputs of the ops running now live (set by the function layer)."""

    INFER = "infer"  # device when a device tensor is involved, else unwatched host memory
    DEVICE = "device"
    PINNED = "pinned"
    HOST = "host"  # plain host memory, unwatched (the result of a blocking ``.cpu()``)


class Memory(Protocol):
    """What a mode tells the dispatch layer about memory and streams."""

    placement: str

    def lookup(self, t: torch.Tensor) -> StorageInfo | None:
        """The watched storage ``t`` views, or None (unwatched host memory)."""
        ...

    def fresh_placement(self, t: torch.Tensor, device_involved: bool) -> str:
        """Where a fresh output ``t`` lives: a :class:`Placement` value other than INFER."""
        ...

    def current_agent(self) -> int:
        """The detector agent of the current stream."""
        ...

    def register(self, t: torch.Tensor, pinned: bool, agent: int, label: str,
                 site: str | None = None) -> StorageInfo:
        """Watch the storage of a fresh tensor ``t``."""
        ...

    def record_stream(self, t: torch.Tensor, stream: Any) -> None:
        """``t.record_stream(stream)``."""
        ...


def access_of(info: StorageInfo, t: torch.Tensor, write: bool, ids: Any = None) -> Access:
    """The access of view ``t`` (or of its elements ``ids``) in ``info``'s element size."""
    elems = element_ids(t) if ids is None else ids
    return Access(info, to_storage_elements(elems, t.element_size(), info.itemsize), write)


@functools.cache
def op_name(func: Any) -> str:
    """``add_`` for ``aten.add_.Tensor``: the name a user knows (read once per op)."""
    return func._schema.name.split("::")[-1]


def tensor_label(name: str, site: str, position: int, count: int,
                 targets: Targets | None) -> str:
    """``buf@prog.py:12``: a fresh tensor's name in reports (the variable its statement
    assigns output ``position`` of ``count`` to, else the op's name) and where it was
    allocated."""
    variable = targets.output(position, count) if targets is not None else None
    if variable is None:
        variable = f"{name}[{position}]" if count > 1 else name
    return label(variable, name, site)


class RecordingDispatchMode(TorchDispatchMode):
    """Records every aten op into ``recording`` through ``memory`` (see the module doc)."""

    paused = PerThread(lambda mode: 0)  # each thread's own (a host read pauses its thread)
    quiet = PerThread(lambda mode: 0)

    def __init__(self, recording: Recording, memory: Memory) -> None:
        super().__init__()
        self.recording = recording
        self.memory = memory
        self.paused = 0  # >0: record nothing (a host read that bypasses the dispatcher)
        self.quiet = 0  # >0 inside a declared kernel: watch fresh outputs, record no op
        self.resizes: Any = None  # recorder.storages.StorageResizes: storages an op moved
        self.live = True  # False once the watch ended (a thread it started may still run)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch would wrap the hook in ``torch._disable_dynamo``, which imports
        ``torch._dynamo`` on the first op; :func:`skipped_by_dynamo` keeps Dynamo out instead
        (recorder/compile_guard.py)."""
        return False

    @skipped_by_dynamo
    @untraced
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        device_views = getattr(self.memory, "device_views", None)
        facts = op_facts(func)
        if not self.live or self.paused or facts.passes:
            out = func(*args, **kwargs)
            if device_views is not None and facts.view:
                device_views.propagate(args, out)  # a view of a device view is one too
            return out
        if func is aten.record_stream.default:
            self.memory.record_stream(args[0], args[1])
            return func(*args, **kwargs)
        memory = self.memory
        if self.quiet:
            out = func(*args, **kwargs)
            for t, pinned in self._fresh_outputs(func, out, memory.placement == Placement.DEVICE
                                                 or self._any_device(func, args, kwargs)):
                memory.register(t, pinned, memory.current_agent(), facts.name)
            return out
        inputs = []
        device_involved = memory.placement == Placement.DEVICE
        host_involved = False
        for t, write in arguments_accessed(facts.arguments, args, kwargs):
            info = memory.lookup(t)
            if info is None:
                host_involved = True
                continue
            if reaches_host(device_views, info, t):
                host_involved = True
            else:  # device memory, or pinned memory a kernel reads through a device view
                device_involved = True
            if not (facts.like and args and t is args[0]):
                inputs.append((t, info, write))
        capture = self.recording.capture  # a CUDA graph capture runs nothing (recorder.graphs)
        if capture is not None and device_involved and capture.takes(memory.current_agent()):
            refuse_pageable_copy_in_capture(memory, func, args, kwargs, device_involved)
            out = capture.run_unapplied(func, args, kwargs)
        else:
            capture = None
            out = func(*args, **kwargs)
        if self.resizes is not None:
            inputs = self.resizes.follow_moves(inputs)
        fresh = self._fresh_outputs(func, out, device_involved)
        if not inputs and not fresh:
            return out
        return self._record(func, args, kwargs, out, inputs, fresh, device_involved,
                            host_involved, capture)

    def _any_device(self, func: Any, args: tuple, kwargs: dict) -> bool:
        for t, _write in arguments_accessed(op_facts(func).arguments, args, kwargs):
            info = self.memory.lookup(t)
            if info is not None and not info.pinned:
                return True
        return False

    def _fresh_outputs(self, func: Any, out: Any, device_involved: bool) -> list[tuple]:
        """Fresh tensors the op returned, with where they live (watched ones only)."""
        values = out if isinstance(out, tuple | list) else (out,)
        fresh = []
        for fresh_return, value in zip(op_facts(func).fresh, values, strict=False):
            if not fresh_return or not isinstance(value, torch.Tensor):
                continue
            if value.numel() == 0:
                continue
            where = self.memory.placement
            if where == Placement.INFER:
                where = self.memory.fresh_placement(value, device_involved)
            if where in (Placement.DEVICE, Placement.PINNED):
                fresh.append((value, where == Placement.PINNED))
        return fresh

    def input_accesses(self, func: Any, args: tuple, kwargs: dict, inputs: list,
                       indices: bool = True) -> list[Access]:
        """The accesses of an op's watched arguments ``inputs`` (``(tensor, info, write)``):
        an indexing op touches only the elements its index values pick (whole views when
        ``indices`` is False: the values cannot be read now, during a GPU graph capture)."""
        accesses: list[Access] = []
        picked = index_elements(func, args, kwargs) if inputs and indices else None
        for position, (t, info, write) in enumerate(inputs):
            if position == 0 and picked is not None and t is args[0]:
                ids, reads, writes = picked
                if reads:
                    accesses.append(access_of(info, t, False, ids))
                if writes:
                    accesses.append(access_of(info, t, True, ids))
                continue
            accesses.append(access_of(info, t, write))
        return accesses

    def _record(self, func: Any, args: tuple, kwargs: dict, out: Any, inputs: list,
                fresh: list, device_involved: bool, host_involved: bool,
                capture: Any = None) -> Any:
        recording = self.recording
        memory = self.memory
        facts = op_facts(func)
        name = facts.name
        on_device = device_involved or any(not pinned for _t, pinned in fresh)
        agent = memory.current_agent() if on_device else HOST_AGENT
        site = user_site()
        accesses = self.input_accesses(func, args, kwargs, inputs,
                                       indices=capture is None or capture.computes)
        written = []  # the fresh outputs
        if fresh:
            targets = targets_here()
            outputs = out if isinstance(out, tuple | list) else (out,)
        for t, pinned in fresh:
            position = next(i for i, value in enumerate(outputs) if value is t)
            info = memory.register(t, pinned, agent,
                                   tensor_label(name, site, position, len(outputs), targets),
                                   site)
            if not facts.allocates:
                written.append(access_of(info, t, True))
        accesses += written
        if not accesses:  # an allocation alone: watched from now on, no node
            return out
        device_views = getattr(memory, "device_views", None)
        touches_pinned = any(reaches_host(device_views, info, t)
                             for t, info, _write in inputs) or any(p for _t, p in fresh)
        if agent == HOST_AGENT:
            kind = OpKind.HOST_WRITE if any(a.write for a in accesses) else OpKind.HOST_READ
        elif touches_pinned or facts.copy:
            kind = OpKind.COPY
        else:
            kind = OpKind.KERNEL
        replay = None if capture is None else capture.replayable(self, func, args, kwargs, out,
                                                                 inputs, written)
        op = recording.op(name, agent, accesses, kind, site=site, replay=replay)
        if facts.copy and host_involved and agent != HOST_AGENT:
            note_pageable_copy(recording, memory, func, args, kwargs, out, op, agent, site)
        if agent != HOST_AGENT and self._blocks_host(func, args, kwargs, out, host_involved):
            recording.host_sync(f"{name} (blocking)", [op])
        return out

    def _blocks_host(self, func: Any, args: tuple, kwargs: dict, out: Any,
                     host_involved: bool) -> bool:
        """A blocking host<->device copy (``copy_``, ``.to``, ``.cpu()``) or a scalar read of
        device memory."""
        if func is aten._local_scalar_dense.default or op_facts(func).value_shaped:
            return True
        if func is aten.repeat_interleave.Tensor:
            return kwargs.get("output_size") is None
        if func is aten.index.Tensor:  # a bool mask index is a nonzero() first
            return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
                       for index in args[1] if index is not None)
        if func is aten._to_copy.default:
            target = self.memory.lookup(out) if isinstance(out, torch.Tensor) else None
            to_host = target is None or target.pinned
            return (host_involved or to_host) and not kwargs.get("non_blocking", False)
        if func is aten.copy_.default and host_involved:
            if args[1].dim() == 0 and self.memory.lookup(args[1]) is None:
                return False  # ``t[i] = 5``: a fill with the scalar's value, no sync
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if not non_blocking:
                return True
            # non_blocking into pageable host memory: on today's CUDA the copy returns to the
            # host only once it is done (STREAM-SEMANTICS.md, 'Pageable host memory')
            source = self.memory.lookup(args[1])
            return (self.memory.lookup(args[0]) is None and args[0].device.type == "cpu"
                    and source is not None and not source.pinned)
        return False


_expired = torch.UntypedStorage._expired  # torch's own check of a storage's weak reference


def alive_test(storage: torch.UntypedStorage) -> Callable[[], bool]:
    """A call that says whether ``storage`` still lives, holding only a weak reference to
    it. It asks torch's check directly: ``StorageWeakRef.expired`` reaches it through two
    Python calls (one a classmethod of ``TypedStorage``), and the recorder's sweep before
    each allocation asks every live storage (SGLang's necessity table: 1.5 million asks,
    6% of its CPU)."""
    weak = StorageWeakRef(storage)  # the closure keeps it: its end frees the reference
    test = lambda: not _expired(weak.cdata)  # noqa: E731  (a function with attributes)
    # what the recording's sweep calls directly, many tests in one map (Recording.sweep)
    test.expired, test.weak_cdata = _expired, weak.cdata  # type: ignore[attr-defined]
    return test


def register_storage(recording: Recording, t: torch.Tensor, pinned: bool, agent: int,
                     label: str, site: str | None = None) -> StorageInfo:
    """Tell ``recording`` about the storage behind ``t`` (device or pinned memory), watched
    through a weak reference so its block goes back to the pool when the program drops it.
    ``site``: the user's line that allocated it, when the caller has it already (else found
    from the stack, the same line)."""
    storage = t.untyped_storage()
    itemsize = t.element_size()
    return recording.allocate(storage.data_ptr(), storage.nbytes() // itemsize, itemsize,
                              t.dtype, tuple(t.shape), pinned, agent, alive_test(storage),
                              label, site)
