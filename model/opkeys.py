"""Op keys: one name for an op across devices, so a plan made on one can steer another.

Op ids are issue-order positions, and two devices running one program can number ops
differently (an allocation node exists only where the allocator waited). An op that touches
memory is named instead by its agent, its op name, its iteration and the occurrence of that
triple in issue order, which the program alone decides.
"""

from __future__ import annotations

from overlap_harness.model.trace import OpKind

OpKey = tuple[str, str, int, int]  # agent, op name, iteration, occurrence in issue order
Gate = tuple[OpKey, OpKey]  # (the op that finishes first, the op whose work waits for it)
ACCESS_KINDS = (OpKind.KERNEL, OpKind.COPY, OpKind.HOST_READ, OpKind.HOST_WRITE)


class KeyCounter:
    """Hands out :data:`OpKey` s in issue order."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, int], int] = {}

    def key(self, agent: str, name: str, iteration: int) -> OpKey:
        """The key of the next op ``name`` on ``agent`` in ``iteration``."""
        k = (agent, name, iteration)
        n = self._seen.get(k, 0)
        self._seen[k] = n + 1
        return (agent, name, iteration, n)


Delays = dict[tuple[str, int], float]  # extra µs before an op starts, by (op name, iteration)


def delays_to_json(delays: Delays) -> dict[str, float]:
    """Delays as JSON keys ``"name@iteration"``, to the ns (the simulator's unit), so a CPU
    test or a profile check can simulate a GPU report's schedule again."""
    return {f"{name}@{iteration}": round(us, 3) for (name, iteration), us in sorted(delays.items())}


def delays_from_json(raw: dict[str, float]) -> Delays:
    """:func:`delays_to_json` read back."""
    out = {}
    for key, us in raw.items():
        name, _, iteration = key.rpartition("@")
        out[(name, int(iteration))] = float(us)
    return out
