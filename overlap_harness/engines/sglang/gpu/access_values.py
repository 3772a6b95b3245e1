"""The values at a race's own accesses, on the device: what each op at a race side's line
produced, copied off the device in stream order, compared with the serial run's.

A necessary row whose race the probe saw made can still end with ``output_ids`` and
``req_to_token`` equal to the serial answer: the value the race corrupted is overwritten, or
not read, before it reaches them (``overwritten``). The corruption itself is then visible only
where the race happened. So each op issued from a race side's line (either side: a RAW's later
read takes a stale value, a WAR's earlier read sees the later write) has its outputs copied on
the device by a copy queued right after it on its own stream: the copy runs when the op has,
so it holds exactly what the op left, and the host does not wait (no ordering is added
between the race's sides). After the run, each line's values, in the order its ops were
issued, are compared with the serial run's.

Controls: the serial run is made twice, the allocator's cached blocks dirtied in between
(:func:`dirty_allocator_cache`), and an op whose values differ between the two (an address,
memory an op leaves unwritten, a line reached a different number of times) is not compared
(:func:`unstable_accesses`). And a trial whose probe did not see the race made must
show no difference here (the report counts those that do, ``access_wrong_unmade_trials``):
values that differ from run to run for another reason would show there first.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from overlap_harness.engines.sglang.gpu.probe import _key, _matches


def side_locations(race_examples: Sequence[str]) -> tuple[str, ...]:
    """Both sides' ``file:line`` of the loop report's ``race_examples``
    (``'RAW x: op on self.S at a.py:1 / op on host at b.py:2'``), in first-seen order."""
    out: list[str] = []
    for example in race_examples:
        _, _, sides = example.partition(": ")
        for side in sides.split(" / "):
            where = side.rpartition(" at ")[2].strip()
            if where and where not in out:
                out.append(where)
    return tuple(out)


class AccessCapture:
    """Snapshots of what the ops at ``locations`` left, in issue order per location."""

    def __init__(self, locations: Sequence[str]) -> None:
        self.locations = tuple(locations)
        self._keys = [(_key(location), location) for location in self.locations]
        self._snapshots: dict[str, list[torch.Tensor]] = {}

    def location(self, depth: int = 3) -> str | None:
        """The side line the op being issued comes from (``depth`` frames up, then outward),
        or None."""
        frame = sys._getframe(depth)
        while frame is not None:
            for key, location in self._keys:
                if _matches(frame, [key]):
                    return location
            frame = frame.f_back
        return None

    def capture(self, location: str, out: Any) -> None:
        """Queue a device-side copy of each device tensor of ``out`` (and of each pinned host
        tensor: a D2H copy's destination) on the current stream, right after the op that
        made it: stream-ordered, and nothing on the host (a pinned
        snapshot, as the first device run of 2026-12-07 took, allocates page-locked memory
        per op, which the driver may serialise with the device)."""
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            if tensor.is_cuda:
                self._snapshots.setdefault(location, []).append(tensor.detach().clone())
            elif tensor.device.type == "cpu" and tensor.is_pinned():
                # a device op's host output (a D2H copy into pinned memory, SGLang's relays
                # and result copies): copied back to the device on the same stream, right
                # after the op, so it holds what the copy left, with no host wait
                self._snapshots.setdefault(location, []).append(
                    tensor.detach().to("cuda", non_blocking=True))

    def values(self) -> dict[str, list[Any]]:
        """Every snapshot's values, after the device finished (call once the run is over)."""
        torch.cuda.synchronize()
        return {location: [snapshot.tolist() for snapshot in snapshots]
                for location, snapshots in self._snapshots.items()}


#: sizes (bytes) of the blocks :func:`dirty_allocator_cache` fills: the caching allocator's
#: small pool (up to 1 MiB, carved from 2 MiB segments) and a few large blocks
DIRTY_BLOCK_BYTES = (*(1 << k for k in range(9, 21)), 2 << 20, 8 << 20, 32 << 20)
DIRTY_BLOCKS_PER_SIZE = 8
DIRTY_BYTE = 0xA5


def dirty_allocator_cache(device: str = "cuda") -> int:
    """Fill blocks of the caching allocator's cache with :data:`DIRTY_BYTE` and give them
    back (cached, not released): the next run's fresh tensors then start from that pattern
    where the run before left its own values. Made before the second serial run, so that an
    op's output element it never writes (a ``torch.empty`` read before it is written) differs
    between the two serial runs and is not compared (the first device run of the
    serial-twice control, 2026-12-07, still showed such elements: both serial runs got the
    same reused memory). Returns the number of bytes filled."""
    import torch

    blocks = [torch.full((size,), DIRTY_BYTE, dtype=torch.uint8, device=device)
              for size in DIRTY_BLOCK_BYTES for _ in range(DIRTY_BLOCKS_PER_SIZE)]
    filled = sum(block.numel() for block in blocks)
    del blocks
    return filled


#: sizes (bytes) of the page-locked blocks :func:`dirty_host_cache` fills: torch's host
#: caching allocator rounds a request up to a power of two and hands out the block of that
#: size freed last (a LIFO list per size), so these cover SGLang's pinned D2H destinations
#: (a batch's token ids, lengths, flags) up to 1 MiB
DIRTY_HOST_BLOCK_BYTES = tuple(1 << k for k in range(3, 21))


def dirty_host_cache() -> int:
    """Fill page-locked blocks of torch's host caching allocator with :data:`DIRTY_BYTE` and
    give them back: the next pinned tensor of each size (SGLang's ``async_d2h`` destination,
    ``torch.empty(..., pin_memory=True)``) starts from that pattern. Without it a forced
    trial's pinned block may be the one the serial run before it freed last, still holding
    the serial run's own values, so a host read that runs before its D2H copy lands could
    read the right value by accident. A guard, not a measured cause: in the first dirtied
    runs (2026-12-07) the pattern itself reached ``output_ids`` in 3 trials, while the rows
    that newly showed a wrong value did so at escalated delays with ordinary stale values.
    Returns the number of bytes filled."""
    blocks = [torch.empty((size,), dtype=torch.uint8, pin_memory=True).fill_(DIRTY_BYTE)
              for size in DIRTY_HOST_BLOCK_BYTES for _ in range(DIRTY_BLOCKS_PER_SIZE)]
    filled = sum(block.numel() for block in blocks)
    del blocks
    return filled


def dirty_caches(device: str = "cuda") -> int:
    """Both caches dirtied (:func:`dirty_allocator_cache`, :func:`dirty_host_cache`): what
    a forced trial and the second serial run start from, so that memory read before it is
    written holds the pattern, never an earlier run's right answer. Returns the bytes
    filled."""
    return dirty_allocator_cache(device) + dirty_host_cache()


def unstable_accesses(first: dict[str, list[Any]], second: dict[str, list[Any]]
                      ) -> list[list[Any]]:
    """``[location, op index]`` of each op whose values differ between two serial runs, and
    ``[location, None]`` for a line the two reached a different number of times: values no
    forced trial can be compared on."""
    out: list[list[Any]] = []
    for location in dict.fromkeys([*first, *second]):
        one, two = first.get(location, []), second.get(location, [])
        if len(one) != len(two):
            out.append([location, None])
            continue
        out += [[location, index] for index, (a, b) in enumerate(zip(one, two, strict=True))
                if a != b]
    return out


def first_access_difference(observed: dict[str, list[Any]], serial: dict[str, list[Any]],
                            locations: Sequence[str], unstable: Sequence[Sequence[Any]] = ()
                            ) -> str | None:
    """The first value at one of ``locations`` that differs from the serial run's, as text
    (``'sglang/x.py:12, its op 3: [4, 0] (serial [4, 5])'``); None when every one is equal.
    A line reached a different number of times says so (the run took another path). The ops
    of ``unstable`` (:func:`unstable_accesses`) are not compared."""
    skipped = {(location, index) for location, index in unstable}
    for location in locations:
        if (location, None) in skipped:
            continue
        got, want = observed.get(location, []), serial.get(location, [])
        for index, (value, expected) in enumerate(zip(got, want, strict=False)):
            if value != expected and (location, index) not in skipped:
                return (f"{location}, its op {index + 1}: {_short(value)} "
                        f"(serial {_short(expected)})")
        if len(got) != len(want):
            return f"{location}: {len(got)} ops (serial {len(want)})"
    return None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
