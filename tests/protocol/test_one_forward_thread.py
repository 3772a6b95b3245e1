"""TokenSpeed's one-forward-thread design in the protocol model (``protocol.loop =
"one_forward_thread"``): race-free intact with the committed tokens an independent chain
gives, and each of its four syncs removed races at the buffer that sync orders, every
racy removal beside its race-free intact twin."""

from __future__ import annotations

import dataclasses as dc

import pytest

from overlap_harness.model.config import (
    EventKind,
    Loop,
    ProtocolConfig,
    Request,
    Timing,
    Workload,
    WorkloadEvent,
)
from overlap_harness.model.errors import HarnessError
from overlap_harness.model.protocol import run_protocol
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import run_with_oracle

LOOP = ProtocolConfig(loop=Loop.ONE_FORWARD_THREAD, pool_size=8, page_size=4)
THREE = Workload(iterations=5, requests=(Request("r0", 0, 6, 5), Request("r1", 0, 5, 5),
                                         Request("r2", 0, 10, 5)))
CHUNKED = Workload(iterations=6, requests=(Request("r0", 0, 6, 6), Request("r1", 0, 5, 6),
                                           Request("r2", 1, 10, 3, chunks=3)))
IDLE = dc.replace(THREE, requests=tuple(dc.replace(r, max_new=4) for r in THREE.requests),
                  events=(WorkloadEvent(2, EventKind.IDLE),))


def _chain(request: Request) -> list[int]:
    """The tokens a width-1 run commits, computed apart from the model: a request's prompt
    starts at (sum of its name's code points) mod 64 and counts up; each token is
    (7 x + 3) mod 64 of the one before, the first of the prompt's last."""
    start = sum(map(ord, request.id)) % 64
    token, out = (start + request.prompt_len - 1) % 64, []
    for _ in range(request.max_new):
        token = (7 * token + 3) % 64
        out.append(token)
    return out


def races(proto: ProtocolConfig, workload: Workload, removed: tuple[str, ...] = ()
          ) -> set[tuple[str, str]]:
    """(kind, buffer) of every race; a race-free run matches the serial oracle."""
    paired = run_with_oracle(proto, workload, removed)
    found = {(str(r.kind), r.buffer.split("@")[0]) for r in paired.races}
    if not found:
        assert paired.diffs == []
    return found


@pytest.mark.parametrize("proto, workload", [
    (LOOP, THREE), (LOOP, CHUNKED), (dc.replace(LOOP, in_flight_depth=0), THREE),
    (LOOP, IDLE)])
def test_intact_it_is_race_free_and_commits_each_requests_chain(proto, workload) -> None:
    dev = SimDevice()
    outcome = run_protocol(dev, (proto, workload, Timing()))
    assert dev.finish().races == []
    for request in workload.requests:
        assert outcome.requests[request.id].tokens == _chain(request), request.id
    assert races(proto, workload) == set()


def test_a_drafter_and_a_prefix_hit_run_race_free_and_fill_every_request() -> None:
    drafter = dc.replace(LOOP, draft_width=2)
    long = dc.replace(THREE, requests=tuple(dc.replace(r, max_new=13) for r in THREE.requests))
    dev = SimDevice()
    outcome = run_protocol(dev, (drafter, long, Timing()))
    assert dev.finish().races == []
    assert all(len(outcome.requests[r.id].tokens) == 13 for r in long.requests)
    hit = dc.replace(LOOP, cached_prefix=4)
    later = dc.replace(THREE, requests=(THREE.requests[0],
                                        *(dc.replace(r, arrive=1, max_new=4)
                                          for r in THREE.requests[1:])))
    assert races(hit, later) == set()
    assert races(drafter, long) == set()


@pytest.mark.parametrize("label, race", [
    # the pages a decode round hands out are zeroed on the default stream; the forward on
    # the execution stream reads and writes them
    ("exec.forward_wait", ("RAW", "kv_pages")),
    # the cache lengths' first write on the execution stream vs their zeroing at creation
    ("exec.cache_lengths_wait", ("WAW", "valid_cache_lengths")),
    # the commit's host read of the pinned output vs the copy into it
    ("copy_event.host_wait", ("host-D2H", "cpu_pack_0")),
    ("copy_event.record", ("host-D2H", "cpu_pack_0")),
])
@pytest.mark.parametrize("proto", [LOOP, dc.replace(LOOP, in_flight_depth=0)])
def test_each_sync_removed_races_where_it_orders(label, race, proto) -> None:
    assert race in races(proto, THREE, (label,))
    assert races(proto, THREE) == set()


def test_the_forward_wait_orders_only_rounds_without_an_extend() -> None:
    """A round that extends makes the execution stream wait on the default stream before the
    cache lengths are written, which orders its page zeroing too: a workload whose decodes
    never cross a page boundary needs the forward's own wait nowhere."""
    short = Workload(iterations=3, requests=(Request("a", 0, 2, 3),))
    assert races(LOOP, short, ("exec.forward_wait",)) == set()
    assert ("RAW", "kv_pages") in races(LOOP, THREE, ("exec.forward_wait",))


def test_row_zero_is_never_handed_out() -> None:
    crowded = Workload(iterations=2, requests=tuple(Request(f"q{i}", 0, 2, 1)
                                                    for i in range(8)))
    with pytest.raises(HarnessError, match="row 0 reserved"):
        run_protocol(SimDevice(), (LOOP, crowded, Timing()))
    assert races(LOOP, dc.replace(crowded, requests=crowded.requests[:7])) == set()
