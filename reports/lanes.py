"""Lane order and event arrows of a timeline: what the plots and the Perfetto trace share.

Kept apart from :mod:`overlap_harness.reports.timeline` so that the trace writer (and the
process that writes the text reports) does not import matplotlib: that import alone is about
half a CPU second, and only the plot workers need it (issue 17 item 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from overlap_harness.model.trace import OpKind, OpRecord

#: Lanes first in this order, then any other agent in order of first appearance.
LANE_ORDER = ("host", "schedule", "forward", "d2h")


def lane_order(timeline: Sequence[OpRecord]) -> list[str]:
    """Agents of ``timeline``: host, schedule, forward, d2h (those present), then the rest."""
    seen = list(dict.fromkeys(t.agent for t in timeline))
    return [a for a in LANE_ORDER if a in seen] + [a for a in seen if a not in LANE_ORDER]


def event_arrows(timeline: Sequence[OpRecord]) -> list[tuple[OpRecord, OpRecord]]:
    """(record, wait) pairs: each ``wait:X`` with the latest ``record:X`` issued before it.

    A wait with no earlier record (a no-op wait) gets no arrow.
    """
    latest: dict[str, OpRecord] = {}
    pairs = []
    for t in sorted(timeline, key=lambda t: t.op):
        if t.kind == OpKind.RECORD and t.name.startswith("record:"):
            latest[t.name[len("record:"):]] = t
        elif t.kind == OpKind.WAIT and t.name.startswith("wait:"):
            rec = latest.get(t.name[len("wait:"):])
            if rec is not None:
                pairs.append((rec, t))
    return pairs


def wait_arrows(timeline: Sequence[OpRecord],
                bound: Sequence[tuple[int, int]] = ()) -> list[tuple[OpRecord, OpRecord]]:
    """(record, wait) pairs of ``timeline``: ``bound``, the (record op, wait op) bindings the
    device made as the program ran (the recorder's, whose op names follow the user's
    variables), those of ops in ``timeline``; without them, found by name
    (:func:`event_arrows`: the simulated and CUDA devices name ops ``record:X``/``wait:X``)."""
    if not bound:
        return event_arrows(timeline)
    by_op = {t.op: t for t in timeline}
    return [(by_op[rec], by_op[wait]) for rec, wait in bound if rec in by_op and wait in by_op]
