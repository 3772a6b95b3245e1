"""Host threads in the detector (STREAM-SEMANTICS.md "host threads"): a stream node follows
the issue order of the host that issued it (``issuer``), not the main host's; threads are
ordered only by the joins they are fed. Each case has its twin with the ordering restored."""

from __future__ import annotations

import numpy as np
import pytest

from overlap_harness.model.detector import HOST_AGENT, AccessReq, HBDetector, NodeInfo
from overlap_harness.model.trace import OpKind


class Feed:
    """Nodes fed directly: kernels on streams issued by a given host, host syncs."""

    def __init__(self) -> None:
        self.det = HBDetector()
        self.det.add_storage(0, 8, (8,))
        self.op = 0

    def node(self, agent: int, kind: OpKind, issuer: int = HOST_AGENT,
             write: bool | None = None, joins: tuple[int, ...] = ()) -> int:
        self.det.issuer = issuer
        info = NodeInfo(self.op, f"n{self.op}", agent, self.det.agent_names[agent], kind, 0, "",
                        None, 0, 0)
        accesses = [] if write is None else [AccessReq(0, 0, "buf", np.arange(8), write)]
        self.det.on_op(info, accesses, joins)
        self.op += 1
        return info.op


@pytest.mark.parametrize("joined", [True, False])
def test_a_stream_node_follows_its_issuing_threads_past(joined: bool) -> None:
    feed = Feed()
    side, other = feed.det.add_agent("side"), feed.det.add_agent("other")
    worker = feed.det.add_host("thread worker")
    assert feed.det.is_host(worker) and not feed.det.is_host(side)
    write = feed.node(side, OpKind.KERNEL, write=True)  # issued by the main host
    sync = feed.node(HOST_AGENT, OpKind.HOST_SYNC, joins=(write,))  # main waits for it
    # the worker issues a read: ordered after the write only through a join of the main
    # host's sync (a hand-over); the main host's own past does not order the worker's issue
    if joined:
        feed.node(worker, OpKind.HOST_SYNC, issuer=worker, joins=(sync,))
    feed.node(other, OpKind.KERNEL, issuer=worker, write=False)
    assert [str(r.kind) for r in feed.det.races] == ([] if joined else ["RAW"])
    assert feed.det.host_knows(write) == joined  # the issuer is the worker now
    feed.det.issuer = HOST_AGENT
    assert feed.det.host_knows(write)


def test_host_knows_is_the_issuers_knowledge() -> None:
    feed = Feed()
    side = feed.det.add_agent("side")
    worker = feed.det.add_host("thread worker")
    write = feed.node(side, OpKind.KERNEL, write=True)
    feed.node(HOST_AGENT, OpKind.HOST_SYNC, joins=(write,))
    feed.det.issuer = worker
    assert not feed.det.host_knows(write)
    feed.det.issuer = HOST_AGENT
    assert feed.det.host_knows(write)
