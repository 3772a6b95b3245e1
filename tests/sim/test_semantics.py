"""One test per rule of STREAM-SEMANTICS.md: a short trace, the racy case and its twin with
the sync restored, asserting the detector's verdict and the simulated times (1 µs launches)."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
import torch

from overlap_harness.model.device import SyncLabel
from overlap_harness.model.errors import DeviceUsageError
from overlap_harness.model.trace import OpKind, RaceKind
from overlap_harness.sim.sim_device import SimDevice
from tests.dsl import assert_no_race, assert_races, ints

US = 1000  # ns


def two_streams(dev: SimDevice):
    return dev.stream("schedule"), dev.stream("forward")


def op_times(dev: SimDevice, name: str) -> tuple[int, int, int]:
    rec = [t for t in dev.timeline if t.name == name]
    assert len(rec) == 1, rec
    return rec[0].issue_ns, rec[0].start_ns, rec[0].end_ns


# -- agents: host issue cost, stream FIFO ----------------------------------------------------
def test_host_pays_launch_cost_and_streams_are_fifo(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    dev.launch(s, "a", lambda: ints(1), writes=[(b, [0])], cost_us=10)
    dev.launch(s, "b", lambda: ints(2), writes=[(b, [1])], cost_us=10)
    dev.launch(f, "c", lambda: ints(3), writes=[(b, [2])], cost_us=10)
    assert op_times(dev, "a") == (1 * US, 1 * US, 11 * US)
    assert op_times(dev, "b") == (2 * US, 11 * US, 21 * US)  # waits for a: FIFO
    assert op_times(dev, "c") == (3 * US, 3 * US, 13 * US)  # other stream: overlaps a
    assert_no_race(dev)


def test_two_streams_writing_disjoint_rows_is_race_free(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (8, 4), torch.int64, fill=0)
    dev.launch(s, "rows_1_2", lambda: ints(1), writes=[(b, [1, 2])], cost_us=10)
    dev.launch(f, "rows_3_4", lambda: ints(2), writes=[(b, [3, 4])], cost_us=10)
    assert_no_race(dev)


def test_two_streams_writing_overlapping_rows_race_on_the_common_row_only(dev) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (8, 4), torch.int64, fill=0)
    dev.launch(s, "rows_1_2", lambda: ints(1), writes=[(b, [1, 2])], cost_us=10)
    dev.launch(f, "rows_2_3", lambda: ints(2), writes=[(b, [2, 3])], cost_us=10)
    (race,) = assert_races(dev, 1, "WAW")
    assert race.elements == (8, 9, 10, 11)  # row 2 of a (8, 4) buffer
    assert race.first.op_name == "rows_1_2" and race.second.op_name == "rows_2_3"


def test_column_slices_of_one_row_are_element_precise(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("req_to_token", (4, 16), torch.int64, fill=0)
    dev.launch(s, "write_cols", lambda: ints(7), writes=[(b, (1, slice(8, 12)))], cost_us=5)
    dev.launch(f, "read_cols", lambda v: (), reads=[(b, (1, slice(0, 8)))], cost_us=5)
    assert_no_race(dev)


# -- events ----------------------------------------------------------------------------------
def _raw_pair(dev: SimDevice, sync: bool) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    e = dev.event("e")
    dev.launch(s, "w", lambda: ints(5), writes=[(b, [0])], cost_us=100)
    if sync:
        dev.record(e, s)
        dev.wait_event(f, e)
    dev.launch(f, "r", lambda v: (), reads=[(b, [0])], cost_us=1, observe="r")


@pytest.mark.parametrize("sync", [False, True])
def test_record_then_wait_orders_a_read_after_a_write(dev: SimDevice, sync: bool) -> None:
    _raw_pair(dev, sync)
    if sync:
        assert_no_race(dev)
        assert op_times(dev, "r")[1] == 101 * US  # starts when w ends
        assert dev.observations[("r", -1)][0].tolist() == [5]
    else:
        (race,) = assert_races(dev, 1, "RAW")
        assert race.manifest is True  # the read ran at 2 µs, before the write landed
        assert dev.observations[("r", -1)][0].tolist() == [0]


def test_a_re_record_after_a_wait_does_not_change_what_the_wait_waited_for(dev) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    e = dev.event("e")
    dev.launch(s, "w0", lambda: ints(1), writes=[(b, [0])], cost_us=10)
    dev.record(e, s)
    dev.wait_event(f, e)  # binds to the record covering w0
    dev.launch(s, "w1", lambda: ints(2), writes=[(b, [1])], cost_us=100)
    dev.record(e, s)  # re-record: only waits issued after this see w1
    dev.launch(f, "r", lambda v: (), reads=[(b, [0, 1])], cost_us=1)
    (race,) = assert_races(dev, 1, "RAW")
    assert race.first.op_name == "w1" and race.elements == (1,)
    assert op_times(dev, "r")[1] < op_times(dev, "w1")[2]  # did not wait for w1


def test_wait_on_a_never_recorded_event_is_a_no_op(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    e = dev.event("never")
    dev.launch(s, "w", lambda: ints(1), writes=[(b, [0])], cost_us=50)
    dev.wait_event(f, e)
    dev.launch(f, "r", lambda v: (), reads=[(b, [0])], cost_us=1)
    assert op_times(dev, "r")[1] == 3 * US  # not held back
    assert_races(dev, 1, "RAW")


@pytest.mark.parametrize("sync", [False, True])
def test_wait_stream_is_record_plus_wait(dev: SimDevice, sync: bool) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    dev.launch(f, "busy", lambda: (), cost_us=100)
    dev.launch(f, "read_old", lambda v: (), reads=[(b, [2])], cost_us=10)
    if sync:
        dev.wait_stream(s, f, label=SyncLabel.WAR_BARRIER)
    dev.launch(s, "clobber", lambda: ints(9), writes=[(b, [2])], cost_us=1)
    if sync:
        assert_no_race(dev)
    else:
        (race,) = assert_races(dev, 1, "WAR")
        assert race.manifest is True  # the clobber landed before F got to the read


def test_a_removed_label_skips_the_sync_and_is_logged() -> None:
    dev = SimDevice(removed=["war_barrier"], host_launch_us=1.0)
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    dev.launch(f, "read_old", lambda v: (), reads=[(b, [2])], cost_us=100)
    dev.wait_stream(s, f, label=SyncLabel.WAR_BARRIER)
    dev.launch(s, "clobber", lambda: ints(9), writes=[(b, [2])], cost_us=1)
    assert dev.skipped_syncs == [("war_barrier", -1)]
    assert_races(dev, 1, "WAR")


def _copy_to_pinned(dev: SimDevice):
    """A non-blocking D2H into pinned memory and an event recorded after it."""
    s, _f = two_streams(dev)
    pin = dev.buffer("pin", (2,), torch.int64, pinned=True, fill=0)
    b = dev.buffer("b", (2,), torch.int64, fill=3, stream=s)
    e = dev.event("e")
    dev.copy(s, b, pin, non_blocking=True, cost_us=10)
    dev.record(e, s)
    return pin, e


def _copy_then_query(dev: SimDevice, outcome: bool | None):
    pin, e = _copy_to_pinned(dev)
    dev.host_work("spin", 50)  # long enough that the copy is done by the clock ...
    answer = dev.query(e)
    dev.host_read(pin)
    return answer


def test_a_branching_query_answers_false_by_default_and_orders_nothing(dev: SimDevice) -> None:
    assert _copy_then_query(dev, None) is False  # ... yet the default outcome is not the clock's
    (race,) = assert_races(dev, 1, "host-D2H")
    assert race.manifest is False  # latent: the timing happened to be safe
    (site,) = dev.query_sites
    assert (site.key, site.outcome, site.forced) == (("e", -1, 0), False, False)


def test_a_query_forced_true_is_an_observation_that_orders_what_follows() -> None:
    dev = SimDevice(host_launch_us=1.0, query_outcomes={("e", -1, 0): True})
    assert _copy_then_query(dev, True) is True
    assert_no_race(dev)
    assert dev.det.observation_edges and not dev.det.races
    g = dev.det.graph()
    assert {d["kind"] for *_e, d in g.edges(data=True)} == {"program", "observation"}


def test_a_forced_true_the_clock_has_not_reached_makes_the_host_wait() -> None:
    dev = SimDevice(host_launch_us=1.0, query_outcomes={("e", -1, 0): True})
    s = dev.stream("s")
    b = dev.buffer("b", (2,), torch.int64, fill=3, stream=s)
    e = dev.event("e")
    dev.launch(s, "slow", lambda v: v + 1, reads=[b], writes=[b], cost_us=500)
    dev.record(e, s)
    before = dev.host_ns
    assert dev.query(e) is True
    assert dev.host_ns >= dev.det.nodes[dev.det.event_op(e.id)].end_ns > before


def test_a_query_of_a_never_recorded_event_is_true_and_orders_nothing(dev: SimDevice) -> None:
    e = dev.event("never")
    assert dev.query(e) is True
    assert not dev.det.observation_edges


def test_a_poll_loop_orders_like_synchronize(dev: SimDevice) -> None:
    pin, e = _copy_to_pinned(dev)
    dev.poll(e)
    assert dev.host_read(pin).tolist() == [3, 3]
    assert_no_race(dev)
    assert len(dev.det.observation_edges) == 1


# -- host syncs and copies -------------------------------------------------------------------
@pytest.mark.parametrize("how", ["none", "event", "stream", "device"])
def test_host_read_of_pinned_memory_needs_a_sync_after_a_non_blocking_d2h(dev, how) -> None:
    _s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=7, stream=f)
    pin = dev.buffer("pin", (4,), torch.int64, pinned=True, fill=0)
    e = dev.event("copy_done")
    dev.copy(f, b, pin, non_blocking=True, cost_us=20)
    dev.record(e, f)
    issued_at = dev.host_ns
    {"none": lambda: None, "event": lambda: dev.synchronize(e),
     "stream": lambda: dev.synchronize(f), "device": lambda: dev.synchronize()}[how]()
    value = dev.host_read(pin).tolist()
    if how == "none":
        assert dev.host_ns == issued_at  # non_blocking returned at once
        assert value == [0, 0, 0, 0]  # old value: the copy has not landed
        (race,) = assert_races(dev, 1, "host-D2H")
        assert race.manifest is True and race.second.agent == "host"
    else:
        assert value == [7, 7, 7, 7]
        assert dev.host_ns == op_times(dev, "copy")[2]  # the host blocked until it landed
        assert_no_race(dev)


def test_blocking_copy_orders_host_after_copy_and_copy_after_prior_work(dev) -> None:
    _s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0, stream=f)
    pin = dev.buffer("pin", (4,), torch.int64, pinned=True, fill=0)
    dev.launch(f, "produce", lambda: ints(4), writes=[(b, None)], cost_us=30)
    dev.copy(f, b, pin, non_blocking=False, cost_us=5)
    assert dev.host_ns == op_times(dev, "copy")[2] == op_times(dev, "produce")[2] + 5 * US
    assert dev.host_read(pin).tolist() == [4, 4, 4, 4]
    assert_no_race(dev)


def test_host_write_of_pinned_staging_races_an_unfinished_h2d(dev: SimDevice) -> None:
    s, _f = two_streams(dev)
    pin = dev.buffer("staging", (4,), torch.int64, pinned=True, fill=1)
    b = dev.buffer("ids", (4,), torch.int64, stream=s)
    dev.copy(s, pin, b, non_blocking=True, cost_us=10)
    dev.host_write(pin, None, 2)  # overwrites the staging buffer under the copy
    (race,) = assert_races(dev, 1, "host-D2H")
    assert race.first.mode == "read" and race.second.mode == "write"


def test_host_cannot_read_device_memory(dev: SimDevice) -> None:
    b = dev.buffer("b", (4,), torch.int64, fill=0)
    with pytest.raises(DeviceUsageError, match="copy it to a pinned buffer first"):
        dev.host_read(b)


# -- value model: reads at start, writes at end ----------------------------------------------
def test_kernels_read_at_start_and_write_at_end(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("b", (1,), torch.int64, fill=1)
    dev.launch(s, "slow_writer", lambda: ints(2), writes=[b], cost_us=100)
    dev.launch(f, "early_reader", lambda v: (), reads=[b], cost_us=1, observe="early")
    dev.host_work("later", 200)
    dev.launch(f, "late_reader", lambda v: (), reads=[b], cost_us=1, observe="late")
    assert dev.finish() is not None
    assert dev.observations[("early", -1)][0].tolist() == [1]
    assert dev.observations[("late", -1)][0].tolist() == [2]


# -- caching allocator reuse -----------------------------------------------------------------
@pytest.mark.parametrize("record", [False, True])
def test_allocator_reuse_without_record_stream_races(dev: SimDevice, record: bool) -> None:
    s, f = two_streams(dev)
    idx = dev.buffer("future_indices", (4,), torch.int64, fill=1, stream=s)
    dev.wait_stream(f, s)
    dev.launch(f, "slow", lambda: (), cost_us=100)  # F is behind
    dev.launch(f, "gather", lambda v: (), reads=[idx], cost_us=1, observe="gather")
    if record:
        dev.record_stream(idx, f, label=SyncLabel.FUTURE_INDICES_RECORD_STREAM)
    dev.free(idx)
    new = dev.buffer("next_indices", (4,), torch.int64, stream=s)
    dev.launch(s, "fill_next", lambda: ints(9), writes=[new], cost_us=1)
    if record:
        assert_no_race(dev)
        assert dev.observations[("gather", -1)][0].tolist() == [1, 1, 1, 1]
    else:
        (race,) = assert_races(dev, 1, "reuse")
        assert race.buffer == "future_indices" and race.reused_as == "next_indices"
        assert race.manifest is True
        assert dev.observations[("gather", -1)][0].tolist() == [9, 9, 9, 9]


# -- determinism, timeline, graph ------------------------------------------------------------
def _program(dev: SimDevice) -> list[int]:
    s, f = two_streams(dev)
    b = dev.buffer("b", (8,), torch.int64, fill=0, stream=s)
    pin = dev.buffer("pin", (8,), torch.int64, pinned=True, fill=0)
    e = dev.event("e")
    for i in range(5):
        dev.launch(s, "prep", lambda v, i=i: v[:2] + i, reads=[(b, [0, 1])],
                   writes=[(b, [0, 1])], cost_us=10)
        dev.wait_stream(f, s)
        dev.launch(f, "fwd", lambda v: v[:2] * 2, reads=[(b, [0, 1])], writes=[(b, [2, 3])],
                   cost_us=100)
        dev.record(e, f)
        dev.wait_event(s, e)
    dev.copy(f, b, pin, non_blocking=False, cost_us=3)
    return dev.host_read(pin).tolist()


def test_runs_are_deterministic_for_a_seed_and_race_free_values_ignore_timing() -> None:
    runs = []
    for seed, jitter in [(3, 0.5), (3, 0.5), (4, 0.5), (0, 0.0)]:
        dev = SimDevice(jitter=jitter, seed=seed)
        vals = _program(dev)
        run = dev.finish()
        assert run.races == []
        runs.append((vals, [(t.start_ns, t.end_ns) for t in run.timeline]))
    assert runs[0] == runs[1]  # same seed: same timeline
    assert runs[0][1] != runs[2][1]  # other seed: other timeline ...
    assert runs[0][0] == runs[2][0] == runs[3][0]  # ... same values
    assert all(isinstance(t, int) for _v, tl in runs for pair in tl for t in pair)


def test_serial_mode_is_the_oracle_one_stream_and_no_overlap() -> None:
    dev = SimDevice(serial=True)
    vals = _program(dev)
    run = dev.finish()
    assert run.races == [] and vals == _program(SimDevice())
    kernels = [t for t in run.timeline if t.kind == OpKind.KERNEL]
    assert {t.agent for t in kernels} == {"serial"}
    assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(kernels))


def test_hb_graph_exports_to_networkx_and_agrees_with_the_clocks(dev: SimDevice) -> None:
    _raw_pair(dev, sync=True)
    g = dev.det.graph()
    assert isinstance(g, nx.DiGraph) and g.number_of_nodes() == len(dev.det.nodes)
    w = next(n for n, d in g.nodes(data=True) if d["name"] == "w")
    r = next(n for n, d in g.nodes(data=True) if d["name"] == "r")
    assert nx.has_path(g, w, r) and dev.det.happens_before(w, r)
    assert not dev.det.happens_before(r, w)


# -- values the device decides ---------------------------------------------------------------
def test_reads_of_never_written_memory_are_reported(dev: SimDevice) -> None:
    s, _f = two_streams(dev)
    b = dev.buffer("scratch", (4,), torch.int64, stream=s)  # torch.empty: no fill
    dev.launch(s, "write_0", lambda: ints(1), writes=[(b, [0])], cost_us=1)
    dev.launch(s, "read_0", lambda v: (), reads=[(b, [0])], cost_us=1)
    assert dev.finish().uninit_reads == []
    dev.launch(s, "read_1", lambda v: (), reads=[(b, [0, 1])], cost_us=1)
    assert dev.finish().uninit_reads == ["read_1@-1 reads never-written elements of scratch"]


def test_a_read_that_a_race_brings_before_its_write_lands_is_reported(dev: SimDevice) -> None:
    s, f = two_streams(dev)
    b = dev.buffer("scratch", (2,), torch.int64, stream=s)
    dev.launch(s, "slow_write", lambda: ints(1, 2), writes=[b], cost_us=50)
    dev.launch(f, "early_read", lambda v: (), reads=[b], cost_us=1)  # no wait: a RAW race
    run = dev.finish()
    assert [r.kind for r in run.races] == [RaceKind.RAW]
    assert run.uninit_reads == ["early_read@-1 reads elements of scratch before any write of "
                                "them landed"]


def test_a_scatter_with_repeated_indices_is_reported(dev: SimDevice) -> None:
    s, _f = two_streams(dev)
    b = dev.buffer("kv", (8,), torch.int64, fill=0, stream=s)
    dev.launch(s, "distinct", lambda: ints(1, 2), writes=[(b, [3, 4])], cost_us=1)
    assert dev.finish().dup_writes == []
    dev.launch(s, "aliased", lambda: ints(1, 2), writes=[(b, [5, 5])], cost_us=1)
    (msg,) = dev.finish().dup_writes
    assert msg.startswith("aliased@-1 writes some elements of kv twice")


# -- rules the mutation study found untested (issue 13) ---------------------------------------
@pytest.mark.parametrize("kernel_writes", [True, False])
def test_a_kernel_on_pinned_memory_races_a_host_access_as_raw_or_war(dev, kernel_writes) -> None:
    """A kernel (not a copy) touching pinned memory races a host access by its modes: the
    host-D2H kind is for a copy the host races with, nothing else."""
    s, _f = two_streams(dev)
    pin = dev.buffer("pin", (2,), torch.int64, pinned=True, fill=0)
    if kernel_writes:
        dev.launch(s, "kernel_on_pin", lambda: ints(5, 5), writes=[pin], cost_us=5)
        dev.host_read(pin, name="host_access")
        (race,) = assert_races(dev, 1, "RAW")
    else:
        dev.launch(s, "kernel_on_pin", lambda v: (), reads=[pin], cost_us=5)
        dev.host_write(pin, None, 7, name="host_access")
        (race,) = assert_races(dev, 1, "WAR")
    assert (race.first.op_name, race.second.op_name) == ("kernel_on_pin", "host_access")


@pytest.mark.parametrize("sync", [False, True])
def test_device_synchronize_joins_every_busy_stream(dev: SimDevice, sync: bool) -> None:
    s, f = two_streams(dev)
    pin = dev.buffer("pin", (2,), torch.int64, pinned=True, fill=0)
    a = dev.buffer("a", (2,), torch.int64, fill=1, stream=s)
    b = dev.buffer("b", (2,), torch.int64, fill=2, stream=f)
    dev.launch(s, "busy_s", lambda v: v + 1, reads=[a], writes=[a], cost_us=50)
    dev.launch(f, "busy_f", lambda v: v + 1, reads=[b], writes=[b], cost_us=80)
    dev.copy(f, b, pin, non_blocking=True, cost_us=5, name="d2h_from_f")
    if sync:
        dev.synchronize()  # device-wide: both streams, not only the first one that is busy
        dev.host_read(pin, name="host_reads")
        assert_no_race(dev)
        assert dev.value(pin).tolist() == [3, 3]
    else:
        dev.synchronize(s)  # the wrong stream: F's copy is not joined
        dev.host_read(pin, name="host_reads")
        (race,) = assert_races(dev, 1, "host-D2H")
        assert race.first.op_name == "d2h_from_f"


def test_work_enqueued_between_the_record_and_the_wait_is_not_waited_for(dev) -> None:
    """The record captures what its stream had when it was issued; a write enqueued on that
    stream after the record, before the other stream's wait, is not ordered by the wait."""
    s, f = two_streams(dev)
    b = dev.buffer("b", (4,), torch.int64, fill=0, stream=s)
    e = dev.event("e")
    dev.launch(s, "before_record", lambda: ints(1), writes=[(b, [0])], cost_us=5)
    dev.record(e, s)
    dev.launch(s, "after_record", lambda: ints(2), writes=[(b, [1])], cost_us=50)
    dev.wait_event(f, e)
    dev.launch(f, "reader", lambda v: (), reads=[(b, [0, 1])], cost_us=1)
    (race,) = assert_races(dev, 1, "RAW")
    assert race.first.op_name == "after_record" and race.elements == (1,)


def test_every_older_unordered_access_of_an_agent_is_reported(dev: SimDevice) -> None:
    """``s0 writes x[0]; s0 writes x[0]; s1 writes x[0]``: two racing pairs, both listed."""
    s, f = two_streams(dev)
    x = dev.buffer("x", (2,), torch.int64, fill=0, stream=s)
    dev.wait_stream(f, s)
    dev.launch(s, "first_write", lambda: ints(1), writes=[(x, [0])], cost_us=5)
    dev.launch(s, "second_write", lambda: ints(2), writes=[(x, [0])], cost_us=5)
    dev.launch(f, "other_write", lambda: ints(3), writes=[(x, [0])], cost_us=5)
    races = assert_races(dev, 2, "WAW", "WAW")
    by_first = {r.first.op_name: r for r in races}
    assert set(by_first) == {"first_write", "second_write"}
    assert by_first["first_write"].older and not by_first["second_write"].older
    assert "older access" in by_first["first_write"].describe()
