"""Storage resizes: memory that changes hands without a tensor being born or dying.

STREAM-SEMANTICS.md ("Storage resizes are frees and allocations"):

- ``t.untyped_storage().resize_(0)`` (also ``t.storage().resize_(0)``, which calls it) frees
  the block: it goes back to the caching-allocator model exactly as when the last tensor of a
  storage is deleted, so an allocation that reuses it races with the old user's accesses
  unless ``record_stream`` or a sync kept it (the FSDP / Megatron way to drop a gathered
  bucket). The storage object lives on, empty; the recorder remembers its name.
- ``resize_(n)`` of an empty storage is a new allocation on the current stream (pinned
  memory: the host's), under the name the storage had before it was emptied (or the variable
  of an empty device tensor, ``torch.empty(0, device="cuda")``, it was made for).
- ``resize_(n)`` of a storage that holds memory moves it (torch allocates the new size, copies
  what fits and frees the old block): an allocation, a copy on the current stream that reads
  the old block and writes the new one, then a free. The same holds for an aten op that moves
  a watched storage while writing it (``Tensor.resize_`` growing it, an ``out=`` argument of
  the wrong size): :meth:`StorageResizes.moved`.

Neither mode's dispatcher sees ``UntypedStorage.resize_`` (a storage method, not an aten op),
so it is patched while a watch runs. ``set_`` rebinds a tensor to another storage: memory does
not change hands (the tensor's old storage is freed when it dies, as any other), and accesses
through the tensor are accesses of the storage it now views, since storages are keyed by their
memory. ``torch.empty_like`` and every other fresh allocation take a block through the same
pool (:mod:`recorder.core`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from overlap_harness.model.detector import HOST_AGENT
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder.core import Access, Recording, StorageInfo
from overlap_harness.recorder.dispatch import alive_test, tensor_label
from overlap_harness.recorder.names import targets_here
from overlap_harness.recorder.patching import Patch
from overlap_harness.recorder.sites import user_site

_RESIZE = vars(torch._C.StorageBase)["resize_"]


class _Empty(NamedTuple):
    """What an empty storage becomes when grown: its name, element size, dtype, pinned."""

    name: str
    itemsize: int
    dtype: Any
    pinned: bool


class StorageResizes:
    """Frees, allocations and moves made by resizing watched storages (module docstring).

    Args:
        recording: the watch's recording.
        memory: the mode's memory (its current stream).
        dispatch: the dispatch mode (its ``paused`` / ``quiet`` counters: a resize inside a
            declared kernel or a host read keeps the bookkeeping but records no copy).
        device_storage: whether an unwatched, empty storage grown now is device memory (GPU
            mode asks torch; CPU mode knows only the storages it saw emptied).
    """

    def __init__(self, recording: Recording, memory: Any, dispatch: Any,
                 device_storage: Any) -> None:
        self.recording = recording
        self.memory = memory
        self.dispatch = dispatch
        self.device_storage = device_storage
        # emptied storages (resize_(0), or made empty): cdata -> (weak reference, former)
        self._emptied: dict[int, tuple[StorageWeakRef, StorageInfo | _Empty]] = {}

    def patches(self) -> list[Patch]:
        """``UntypedStorage.resize_`` routed through :meth:`resize` while the watch runs."""
        return [(torch.UntypedStorage, "resize_",
                 lambda storage, size: self.resize(storage, size))]

    def resize(self, storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        """``storage.resize_(size)`` with its free, allocation or move recorded."""
        old_key, old_bytes = storage.data_ptr(), storage.nbytes()
        info = self.recording.storages.get(old_key) if old_bytes else None
        former = None
        if info is None and not old_bytes:
            former = self._former(storage)
        result = _RESIZE(storage, size)
        new_key = storage.data_ptr()
        if info is not None and not size:
            self.recording.free(old_key)
            self._emptied[storage._cdata] = (StorageWeakRef(storage), info)
        elif info is not None and new_key != old_key:
            self._move(storage, info, min(old_bytes, size) // info.itemsize)
        elif info is not None and size != old_bytes:
            self.recording.free(old_key)  # resized in place: a new block at the same address
            self._allocate(storage, info.name, info.itemsize, info.dtype, info.pinned)
        elif info is None and size and not old_bytes and (
                former is not None or self.device_storage(storage)):
            if former is not None:
                self._allocate(storage, former.name, former.itemsize, former.dtype,
                               former.pinned)
            else:
                name = tensor_label("resize_", user_site(), 0, 1, targets_here())
                self._allocate(storage, name, 1, torch.uint8, False)
        return result

    def moved(self, t: torch.Tensor, info: StorageInfo) -> StorageInfo | None:
        """After an aten op wrote ``t``: the new storage if the op moved ``info``'s storage
        (recorded as a move: allocation, copy of what fits, free), else None."""
        storage = t.untyped_storage()
        if storage.data_ptr() == info.key or info.key not in self.recording.storages:
            return None
        return self._move(storage, info, min(info.numel * info.itemsize,
                                             storage.nbytes()) // info.itemsize)

    def follow_moves(self, inputs: list[tuple[torch.Tensor, StorageInfo, bool]]
                     ) -> list[tuple[torch.Tensor, StorageInfo, bool]]:
        """An aten op's ``(tensor, storage, write)`` after it ran, each written storage the
        op moved replaced by its new one (:meth:`moved`)."""
        out = []
        for t, info, write in inputs:
            new = self.moved(t, info) if write else None
            out.append((t, info if new is None else new, write))
        return out

    def note_empty(self, t: torch.Tensor, pinned: bool) -> None:
        """``t`` was made empty on the device (or pinned): its storage, grown later, is device
        (pinned) memory named after ``t``'s variable (CPU mode cannot tell it from the
        storage)."""
        storage = t.untyped_storage()
        name = tensor_label("empty", user_site(), 0, 1, targets_here())
        self._emptied[storage._cdata] = (StorageWeakRef(storage),
                                         _Empty(name, t.element_size(), t.dtype, pinned))

    def _former(self, storage: torch.UntypedStorage) -> StorageInfo | _Empty | None:
        entry = self._emptied.pop(storage._cdata, None)
        if entry is None or entry[0].expired():
            return None
        return entry[1]

    def _allocate(self, storage: torch.UntypedStorage, name: str, itemsize: int, dtype: Any,
                  pinned: bool) -> StorageInfo:
        numel = storage.nbytes() // itemsize
        agent = HOST_AGENT if pinned else self.memory.current_agent()
        return self.recording.allocate(storage.data_ptr(), numel, itemsize, dtype, (numel,),
                                       pinned, agent, alive_test(storage), name)

    def _move(self, storage: torch.UntypedStorage, old: StorageInfo,
              copied: int) -> StorageInfo:
        new = self._allocate(storage, old.name, old.itemsize, old.dtype, old.pinned)
        if copied and not (self.dispatch.paused or self.dispatch.quiet):
            elements = np.arange(copied)
            agent = HOST_AGENT if old.pinned else self.memory.current_agent()
            kind = OpKind.HOST_WRITE if old.pinned else OpKind.COPY
            self.recording.op("resize_ (move)", agent,
                              [Access(old, elements, False), Access(new, elements, True)], kind)
        self.recording.free(old.key)
        return new
