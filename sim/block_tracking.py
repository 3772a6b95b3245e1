"""The memory blocks of :class:`overlap_harness.sim.sim_device.SimDevice` and what the
device, not the program, decides about their values (:class:`BlockTracking`): reads of
elements the block's owner never wrote (issue order) or whose writes have not landed yet (the
read's simulated time), and scatter writes that name an element twice. Split from
``sim_device.py``, which mixes these in."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from overlap_harness.model.detector import AccessRow
from overlap_harness.model.device import AccessSpec, Buffer, Sel, norm_accesses
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.sim.op_values import may_repeat


@dataclass(slots=True)
class MemoryBlock:
    """A memory block of the caching allocator."""

    id: int
    data: torch.Tensor  # flat
    key: tuple
    written: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    landed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # every element of ``written`` / ``landed`` is set: the per-access checks can be skipped
    # (set only after a whole-block write, found by one ``all()``; reset with the arrays)
    all_written: bool = False
    all_landed: bool = False
    # the buffer that owns the block now (the masks above are its); an op of an earlier owner
    # that starts or ends after the block was handed on uses that owner's retired landed mask
    # (BlockTracking._hand_over)
    owner: int = -1
    recorded: set[int] = field(default_factory=set)  # stream agents from record_stream
    # by buffer shape: the block's memory as a torch view and a numpy view (None: no numpy
    # dtype); a reused block keeps them
    views: dict[tuple[int, ...], tuple[torch.Tensor, np.ndarray | None]] = field(
        default_factory=dict)



_NDARRAY = np.ndarray  # the usual selection's type, one global load on the issue path


def access_rows(specs: Sequence[AccessSpec], write: bool
                ) -> tuple[list[tuple[Buffer, Sel]], tuple[AccessRow, ...]]:
    """``specs`` as :func:`overlap_harness.model.device.norm_accesses` gives them (``(buffer,
    sel)`` pairs, a freed buffer refused), with the access rows the detector keeps: plain
    tuples in :class:`overlap_harness.model.detector.AccessReq` order, the element ids as
    :meth:`Buffer.elements` gives them. One pass for both: this is every kernel's path. An
    index array is applied to the buffer's ids at once (``elements`` does the same), which
    checks its bounds, maps negative ids and leaves the row its own array."""
    if len(specs) == 1:  # the usual kernel: one (buffer, index array) pair, no lists made
        spec = specs[0]
        if type(spec) is tuple and len(spec) == 2 and type(spec[1]) is _NDARRAY:
            buf, sel = spec
            if buf.freed:
                raise DeviceUsageError(f"access to freed buffer {buf.name!r}")
            e = buf.ids[sel]
            if e.ndim != 1:
                e = e.reshape(-1)
            return [spec], ((buf.storage, buf.id, buf.name, e, write, buf.pinned),)
    pairs = norm_accesses(specs)
    return pairs, tuple([(buf.storage, buf.id, buf.name, _element_ids(buf, sel), write,
                          buf.pinned) for buf, sel in pairs])


def _element_ids(buf: Buffer, sel: Sel) -> np.ndarray:
    """:meth:`Buffer.elements`, an index array applied to the ids at once."""
    if type(sel) is _NDARRAY:
        e = buf.ids[sel]
        return e if e.ndim == 1 else e.reshape(-1)
    return buf.elements(sel)


class BlockTracking:
    """The written/landed masks of the device's blocks and the messages they give. The
    device keeps ``_blocks`` (by storage), ``_retired_landed`` and ``_retired_until``
    (:meth:`_hand_over`), ``_uninit`` and ``_dups`` (message by key), ``iteration`` and
    ``_repeats`` (a :class:`overlap_harness.sim.op_values.RepeatCheck`)."""

    _blocks: list[MemoryBlock]
    # by buffer id: the landed mask of a buffer whose block went to a new owner while some
    # element had not landed, and (until, buffer id) in the order they were kept
    _retired_landed: dict[int, np.ndarray]
    _retired_until: deque[tuple[int, int]]
    _uninit: dict[tuple, str]
    _dups: dict[tuple, str]
    iteration: int

    def _track_init(self, name: str, reads: Sequence[AccessRow], writes: Sequence[AccessRow],
                    write_sels: Sequence[tuple[Buffer, Sel]]) -> bool:
        """Values the device, not the program, decides. A read of elements the buffer's
        current owner never wrote (issue order) sees allocator-defined contents
        (``torch.empty``); a write whose index set repeats an element is a scatter whose
        winner is last-in-order on the CPU but undefined on CUDA. ``write_sels`` are the
        ``(buffer, sel)`` pairs behind ``writes``: only an index-array selection can repeat.
        Returns whether one does (its values then land through torch, as they always did).

        A block whose every element was written skips the mask (``all_written``); a count
        of the set mask entries stands for ``all()``, a third of its cost on small arrays."""
        blocks = self._blocks
        for acc in reads:
            block = blocks[acc[0]]
            if not block.all_written:
                e = acc[3]
                if e.size and np.count_nonzero(block.written[e]) != e.size:
                    key = (name, acc[2])
                    if key not in self._uninit:
                        self._uninit[key] = f"{name}@{self.iteration} reads never-written " \
                                            f"elements of {acc[2]}"
        repeated = False
        for i in range(len(writes)):
            w = writes[i]
            e = w[3]
            block = blocks[w[0]]
            if not block.all_written:
                block.written[e] = True
                if e.size >= block.written.size:
                    block.all_written = bool(block.written.all())
            if e.size > 1 and (type(sel := write_sels[i][1]) is _NDARRAY or
                               may_repeat(sel)) and self._repeats.check(e):
                repeated = True
                key = (name, w[2])
                if key not in self._dups:
                    self._dups[key] = f"{name}@{self.iteration} writes some elements of " \
                                      f"{w[2]} twice in one op (order device-defined)"
        return repeated

    def _check_landed(self, name: str, iteration: int, reads: Sequence[AccessRow]) -> None:
        """At a read's simulated time: elements no write of this owner has landed on yet
        hold allocator-defined contents, even where a write was issued earlier (a race
        brought the read forward). Issue-order tracking (:meth:`_track_init`) cannot see it.
        A read through a buffer that no longer owns its block (freed, and the block handed
        to a new buffer before the read's op started) is checked against that buffer's own
        landed mask, kept when the block was handed on (:meth:`_hand_over`), not the new
        owner's."""
        blocks = self._blocks
        for storage, buffer_id, buffer, e, _write, _pinned in reads:
            block = blocks[storage]
            if block.owner == buffer_id:
                if block.all_landed:
                    continue
                landed = block.landed
            else:
                landed = self._retired_landed.get(buffer_id)
                if landed is None:  # every element had landed when it was handed on
                    continue
            if e.size and np.count_nonzero(landed[e]) != e.size:
                key = (name, buffer, "landed")
                if key not in self._uninit and (name, buffer) not in self._uninit:
                    self._uninit[key] = f"{name}@{iteration} reads elements of {buffer} " \
                                        "before any write of them landed"

    def _land(self, writes: Sequence[AccessRow]) -> None:
        """Mark the written elements landed (:meth:`_check_landed` reads the marks): in the
        block's masks, or in the retired mask of the buffer that wrote them when the block
        has been handed on since."""
        blocks = self._blocks
        for w in writes:
            block = blocks[w[0]]
            if block.owner != w[1]:
                self._land_retired(w)
            elif not block.all_landed:
                self._land_block(block, w[3])

    def _land_retired(self, write: AccessRow) -> None:
        """A write of a buffer whose block has a new owner lands: in that buffer's retired
        mask, if one is kept (none: every element had landed already)."""
        landed = self._retired_landed.get(write[1])
        if landed is not None:
            landed[write[3]] = True

    def _hand_over(self, block: MemoryBlock, buffer_id: int, last_end_ns: int) -> None:
        """``block`` goes to the new buffer ``buffer_id``, with masks of its own (nothing
        written or landed). The previous owner's landed mask is kept (unless every element
        had landed) for that owner's ops still to start or end, until the simulated clock
        passes ``last_end_ns``, by which every op issued so far has ended
        (:meth:`_forget_retired`)."""
        if block.owner >= 0 and not block.all_landed:
            self._retired_landed[block.owner] = block.landed
            self._retired_until.append((last_end_ns, block.owner))
        numel = block.data.numel()
        block.written = np.zeros(numel, dtype=bool)
        block.landed = np.zeros(numel, dtype=bool)
        block.all_written = block.all_landed = False
        block.owner = buffer_id

    def _forget_retired(self, now_ns: int) -> None:
        """Drop the retired masks whose owners' ops have all started and ended by ``now_ns``
        (every value event at or before it has run)."""
        retired = self._retired_until
        while retired and retired[0][0] <= now_ns:
            self._retired_landed.pop(retired.popleft()[1], None)

    @staticmethod
    def _land_block(block: MemoryBlock, e: np.ndarray) -> None:
        """Mark elements ``e`` of ``block`` landed (the block is not all landed yet)."""
        block.landed[e] = True
        if e.size >= block.landed.size:
            block.all_landed = bool(block.landed.all())
