"""CUDA graphs under the recorder (STREAM-SEMANTICS.md "CUDA graphs"): a capture runs nothing
and records a template, each replay re-issues it on the replay stream with its values (CPU
mode), captured events fire at each replay, the private pool follows the allocator model.
Every racy case has a twin with the ordering restored; the verdicts are the detector's."""

from __future__ import annotations

import pytest
import torch

from overlap_harness.model.allocator import BlockPool, FreedBlock
from overlap_harness.model.trace import OpKind
from overlap_harness.recorder import RecorderError, declared, reads, watch, writes
from overlap_harness.recorder.core import CAPTURED, Access, Recording
from overlap_harness.recorder.graph_api import FakeCUDAGraph, gpu_patches
from overlap_harness.recorder.graphs import GraphSet


def _raise(what: str, instead: str):
    raise AssertionError(what)


def _kinds(watcher) -> list[tuple[str, str]]:
    """(kind, variable) of every race."""
    return sorted((str(r.kind), r.buffer.split("@")[0]) for r in watcher.races)


def test_a_capture_runs_nothing_and_each_replay_computes_with_the_inputs_of_the_moment():
    with watch("cpu") as watcher:
        static_in = torch.ones(4, device="cuda")
        counter = torch.zeros(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        assert isinstance(graph, FakeCUDAGraph)
        with torch.cuda.graph(graph):
            assert torch.cuda.is_current_stream_capturing()
            counter.add_(static_in)
            static_out = counter * 10
        assert not torch.cuda.is_current_stream_capturing()
        assert counter.tolist() == [0.0] * 4  # captured, not run
        seen = []
        for value in (1.0, 2.0):
            static_in.fill_(value)
            graph.replay()
            seen.append(static_out.tolist())
    assert seen == [[10.0] * 4, [30.0] * 4]
    assert watcher.races == []


def test_work_on_another_stream_during_a_capture_runs_at_once_and_is_not_replayed():
    with watch("cpu") as watcher:
        side = torch.cuda.Stream()
        outside = torch.zeros(2, device="cuda")
        inside = torch.zeros(2, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            inside.add_(1)
            with torch.cuda.stream(side):
                outside.add_(1)  # not forked from the capture: runs now
        torch.cuda.current_stream().wait_stream(side)
        assert outside.tolist() == [1.0, 1.0]
        graph.replay()
        graph.replay()
        torch.cuda.current_stream().wait_stream(side)
        values = (inside.tolist(), outside.tolist())
    assert values == ([2.0, 2.0], [1.0, 1.0])
    assert watcher.races == []


@pytest.mark.parametrize(("join", "races"), [(True, []), (False, [("RAW", "shared")])])
def test_a_fork_inside_the_capture_keeps_its_order_at_each_replay(join, races):
    with watch("cpu") as watcher:
        shared = torch.zeros(8, device="cuda")
        branch = torch.cuda.Stream()
        done = torch.cuda.Event()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            branch.wait_stream(torch.cuda.current_stream())  # the fork
            with torch.cuda.stream(branch):
                shared.add_(1)
                done.record()
            if join:
                torch.cuda.current_stream().wait_event(done)
            total = shared.sum()
            torch.cuda.current_stream().wait_event(done)  # the join CUDA requires
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            graph.replay()
        agents = {r.first.agent for r in watcher.races} | {r.second.agent for r in watcher.races}
        torch.cuda.current_stream().wait_stream(side)
        assert total.item() == 8.0
    assert _kinds(watcher) == races
    if races:  # the forked work replays on the graph's own stream, the rest on ``side``
        assert agents == {"graph/branch", "side"}


def test_a_forked_stream_not_joined_back_fails_at_capture_end_as_on_a_gpu():
    with watch("cpu"):
        branch = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match=r"unjoined work \(branch forked"), \
                torch.cuda.graph(graph):
            branch.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(branch):
                torch.ones(2, device="cuda")
        assert not torch.cuda.is_current_stream_capturing()


@pytest.mark.parametrize("sync", ["synchronize", "item", "stream"])
def test_a_host_sync_during_a_capture_fails_as_on_a_gpu(sync):
    with watch("cpu"):
        x = torch.ones(2, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="operation not permitted when stream is capt"), \
                torch.cuda.graph(graph):
            y = x * 2
            if sync == "synchronize":
                torch.cuda.synchronize()
            elif sync == "item":
                y.sum().item()
            else:
                torch.cuda.current_stream().synchronize()


# Each form that copies pageable host memory to or from the device, beside its twin that a
# capture takes (pinned memory, or a fill with a scalar argument instead of a copy).
_CAPTURE_COPIES = {
    "copy_ from pageable": (lambda dev, host, pinned, rows: dev.copy_(host), True),
    "copy_ from pinned": (lambda dev, host, pinned, rows: dev.copy_(pinned, non_blocking=True),
                          False),
    "to(device) of pageable": (lambda dev, host, pinned, rows: host.to("cuda"), True),
    "to(device) of pinned": (lambda dev, host, pinned, rows: pinned.to("cuda", non_blocking=True),
                             False),
    "dev[index] = scalar": (lambda dev, host, pinned, rows: dev.__setitem__(rows, 1.0), True),
    "index_fill_ scalar": (lambda dev, host, pinned, rows: dev.index_fill_(0, rows, 1.0), False),
    "dev[0] = scalar": (lambda dev, host, pinned, rows: dev.__setitem__(0, 5.0), True),
    "dev[:2] = scalar": (lambda dev, host, pinned, rows: dev.__setitem__(slice(0, 2), 5.0),
                         False),
}


@pytest.mark.parametrize("form", sorted(_CAPTURE_COPIES))
def test_a_copy_of_pageable_host_memory_during_a_capture_fails_as_on_a_gpu(form):
    """pytorch/pytorch#172156: a copy between pageable host memory and the device on a
    capturing stream raises; pinned memory and scalar fills are captured."""
    action, refused = _CAPTURE_COPIES[form]
    with watch("cpu"):
        dev = torch.zeros(4, device="cuda")
        host = torch.ones(4)
        pinned = torch.ones(4).pin_memory()
        rows = torch.tensor([0, 2], device="cuda")
        graph = torch.cuda.CUDAGraph()
        failure = None
        try:
            with torch.cuda.graph(graph):
                action(dev, host, pinned, rows)
        except RuntimeError as error:
            failure = str(error)
    if refused:
        assert failure is not None and "Cannot copy between CPU and CUDA tensors" in failure
    else:
        assert failure is None


@pytest.mark.parametrize(("wait_after_replay", "races"), [(True, []), (False, [("RAW", "out")])])
def test_an_event_recorded_in_the_capture_fires_at_each_replay(wait_after_replay, races):
    with watch("cpu") as watcher:
        x = torch.ones(4, device="cuda")
        ready = torch.cuda.Event(external=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = x + 1
            ready.record()
        side, reader = torch.cuda.Stream(), torch.cuda.Stream()
        reader.wait_stream(torch.cuda.current_stream())
        side.wait_stream(torch.cuda.current_stream())
        if not wait_after_replay:
            reader.wait_event(ready)  # issued before any replay: binds to nothing
        with torch.cuda.stream(side):
            graph.replay()
        if wait_after_replay:
            reader.wait_event(ready)  # binds to the replay's record
        with torch.cuda.stream(reader):
            result = out * 2
        torch.cuda.current_stream().wait_stream(reader)
        torch.cuda.current_stream().wait_stream(side)
        assert result.tolist() == [4.0] * 4
    assert _kinds(watcher) == races


def test_replays_on_two_streams_are_ordered_behind_each_other():
    """CUDA orders each launch of a graph behind its previous launch: no WAW between them."""
    with watch("cpu") as watcher:
        x = torch.ones(4, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = x + 1
        first, second = torch.cuda.Stream(), torch.cuda.Stream()
        first.wait_stream(torch.cuda.current_stream())
        second.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(first):
            graph.replay()
        with torch.cuda.stream(second):
            graph.replay()
            kept = out.clone()
        torch.cuda.current_stream().wait_stream(second)
        assert kept.tolist() == [2.0] * 4
    assert watcher.races == []  # without that order: WAW on out between the replays


@pytest.mark.parametrize(("row", "races"), [(0, []), (2, [("WAR", "ids_source")])])
def test_an_indexing_op_replays_with_the_rows_its_index_names_at_the_replay(row, races):
    with watch("cpu") as watcher:
        ids_source = torch.arange(4, device="cuda")
        index = torch.zeros(1, dtype=torch.int64, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            picked = ids_source[index]
        index.fill_(2)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph.replay()  # reads ids_source[2], not the captured ids_source[0]
        with torch.cuda.stream(side):
            ids_source[row] = 7
        torch.cuda.current_stream().wait_stream(side)
        assert picked.tolist() == [2]
    assert _kinds(watcher) == races


def test_capture_misuse_is_refused_like_torch():
    with watch("cpu"):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            graph.replay()
        with torch.cuda.graph(graph):
            torch.ones(1, device="cuda")
        with pytest.raises(RuntimeError, match="already owns a captured graph"):
            graph.capture_begin()
        graph.reset()
        with pytest.raises(RuntimeError, match="without a preceding successful capture"):
            graph.replay()


def test_an_unmodelled_graph_api_is_refused_even_when_the_program_catches_it():
    refusal = "raw_cuda_graph in CPU mode is not modelled by the recorder; check it in GPU mode"
    with pytest.raises(RecorderError, match=refusal), watch("cpu"):
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RecorderError, match=refusal):
            graph.raw_cuda_graph()


def test_graph_pools_are_tokens_shared_by_captures():
    with watch("cpu"):
        pool = torch.cuda.graph_pool_handle()
        assert pool != torch.cuda.graph_pool_handle()
        first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(first, pool=pool):
            torch.ones(1, device="cuda")
        with torch.cuda.graph(second, pool=first.pool()):
            torch.ones(1, device="cuda")
        assert first.pool() == second.pool() == pool


def test_a_released_graph_pool_hands_no_block_out_again():
    pool = BlockPool()
    key = (4, "float32", False, 1, (0, 1))
    pool.give(FreedBlock(key, "a", 0))
    assert pool.take(key, lambda op: True).storage == 0
    pool.give(FreedBlock(key, "a", 0))
    pool.release_graph_pool((0, 1))
    pool.give(FreedBlock(key, "b", 1))  # freed after the release
    assert pool.take(key, lambda op: True) is None and len(pool) == 0
    plain = (4, "float32", False, 1)
    pool.give(FreedBlock(plain, "c", 2))
    assert pool.take(plain, lambda op: True).storage == 2


def test_allocations_during_a_capture_come_from_the_graph_pool():
    with watch("cpu") as watcher:
        x = torch.ones(16, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = x * 2
        storages = watcher.recording.storages
        pools = {info.name.split("@")[0]: info.graph_pool for info in storages.values()}
        assert pools["x"] is None and pools["out"] == graph.pool()
        del out


@pytest.mark.parametrize("as_module", [False, True])
def test_make_graphed_callables_forward_only(as_module):
    with watch("cpu") as watcher, torch.no_grad():
        if as_module:
            layer = torch.nn.Linear(4, 4).cuda()
            torch.nn.init.constant_(layer.weight, 1.0)
            torch.nn.init.constant_(layer.bias, 0.0)
        else:
            def layer(t):
                return t.sum(dim=1, keepdim=True).expand(-1, 4) + 0.0
        sample = torch.zeros(2, 4, device="cuda")
        graphed = torch.cuda.make_graphed_callables(layer, (sample,))
        first = graphed(torch.ones(2, 4, device="cuda")).tolist()
        second = graphed(torch.full((2, 4), 2.0, device="cuda")).tolist()
    assert first == [[4.0] * 4] * 2 and second == [[8.0] * 4] * 2
    assert watcher.races == [] and watcher.unknown_ops == []


def test_make_graphed_callables_refuses_a_backward_graph():
    refusal = r"test_graphs\.py:\d+: torch\.cuda\.make_graphed_callables with a backward graph"
    with pytest.raises(RecorderError, match=refusal), watch("cpu"):
        layer = torch.nn.Linear(2, 2).cuda()
        with pytest.raises(RecorderError, match=refusal):
            torch.cuda.make_graphed_callables(layer, (torch.zeros(1, 2, device="cuda"),))


def test_without_values_the_template_replays_its_accesses_as_in_gpu_mode():
    """GPU mode's path, driven directly: nothing is computed, the accesses replay."""
    recording = Recording()
    graphs = GraphSet(recording, computes=False, dispatch=None, refuse=_raise)
    default, side = recording.agent("d", "default"), recording.agent("s", "side")
    info = recording.allocate(1, 4, 4, torch.float32, (4,), False, default, lambda: True, "out")
    graph = graphs.new_graph("g")
    graph.begin(default, None)
    write = Access(info, torch.arange(4).numpy(), True)
    assert recording.op("add", default, [write], OpKind.KERNEL) == CAPTURED
    graph.end()
    assert recording.timeline == []  # captured, issued nowhere
    graph.replay(side)
    read = Access(info, torch.arange(4).numpy(), False)
    recording.op("sum", default, [read], OpKind.KERNEL)
    assert [str(r.kind) for r in recording.races] == ["RAW"]
    assert recording.races[0].first.op_name.startswith("g.replay: add")
    recording.sync_stream(side)
    recording.op("sum", default, [read], OpKind.KERNEL)
    assert len(recording.races) == 1


def test_gpu_mode_wraps_torchs_graph_methods(monkeypatch):
    cls = torch.cuda.graphs.CUDAGraph
    before = {name: vars(cls)[name] for name in ("capture_begin", "replay", "reset")}
    for obj, name, value in gpu_patches(GraphSet(Recording(), False, None, _raise), memory=None):
        monkeypatch.setattr(obj, name, value)
    assert all(vars(cls)[name] is not before[name] for name in before)
    assert torch.cuda.make_graphed_callables.__module__.endswith("graph_api")


def test_the_check_command_refuses_an_unmodelled_graph_api_in_one_line(tmp_path, capsys):
    from overlap_harness import cli

    script = tmp_path / "train_step.py"
    script.write_text("import torch\n"
                      "layer = torch.nn.Linear(2, 2).cuda()\n"
                      "torch.cuda.make_graphed_callables(layer, (torch.zeros(1, 2).cuda(),))\n")
    assert cli.main(["check", "--cpu", str(script)]) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.splitlines() == [
        f"overlap-harness check: {script}:3: torch.cuda.make_graphed_callables with a "
        "backward graph "
        "(gradients enabled and an input or parameter requiring grad) is not modelled by the "
        "recorder; call it under torch.no_grad() for the forward graph"]


@declared(lambda result, out, src: reads(src) + writes(out))
def scaled_into(out, src):
    """A kernel the dispatcher cannot see, declared (its body computes the same values)."""
    out.copy_(src * 3)


def test_a_declared_kernel_in_a_capture_runs_again_at_each_replay():
    with watch("cpu") as watcher:
        src = torch.ones(3, device="cuda")
        out = torch.zeros(3, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            scaled_into(out, src)
        seen = []
        for value in (1.0, 2.0):
            src.fill_(value)
            graph.replay()
            seen.append(out.tolist())
    assert seen == [[3.0] * 3, [6.0] * 3]
    assert watcher.races == [] and watcher.unknown_ops == []
    replayed = [r.name for r in watcher.run.timeline if r.name.startswith("graph.replay")]
    assert [name.split(" (")[0] for name in replayed] == ["graph.replay: scaled_into"] * 2


def test_a_replay_inside_another_capture_is_refused():
    refusal = "a CUDA graph replay inside another graph"
    with pytest.raises(RecorderError, match=refusal), watch("cpu"):
        inner, outer = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(inner):
            torch.ones(1, device="cuda")
        with pytest.raises(RecorderError, match=refusal), torch.cuda.graph(outer):
            inner.replay()


@pytest.mark.parametrize("computes", [True, False])
def test_without_host_values_an_indexing_op_in_a_graph_touches_its_whole_view(computes):
    """GPU mode cannot read index values during a capture (it would break it): the captured
    gather reads all of ``table``; CPU mode reads only the row its index names."""
    from overlap_harness.recorder import graph_api

    with watch("cpu") as watcher:
        graph_api._ACTIVE[-1].computes = computes
        table = torch.arange(8.0, device="cuda")
        index = torch.zeros(1, dtype=torch.int64, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            table[index]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph.replay()
        with torch.cuda.stream(side):
            table[5] = -1.0  # a row the gather does not read
        torch.cuda.current_stream().wait_stream(side)
    assert _kinds(watcher) == ([] if computes else [("WAR", "table")])


def test_the_default_capture_stream_is_named_and_numbers_no_program_stream():
    with watch("cpu") as watcher:
        x = torch.ones(2, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x + 1
        assert torch.cuda.graph(graph).capture_stream.name == "capture_stream"
        with torch.cuda.stream(torch.cuda.Stream()):  # unnamed streams: numbered from 1
            graph.replay()
        with torch.cuda.stream(torch.cuda.Stream()):
            y.sum()
    names = {r.first.agent for r in watcher.races} | {r.second.agent for r in watcher.races}
    assert names == {"stream1", "stream2"}


def test_a_captured_cache_write_changes_nothing_until_a_replay_writes_its_rows():
    with watch("cpu") as watcher:
        cache = torch.arange(12.0, device="cuda").reshape(6, 2)
        loc = torch.tensor([1, 4], device="cuda")
        new_rows = torch.full((2, 2), -1.0, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cache[loc] = new_rows  # index_put_: the capture saves and puts back rows 1 and 4
        untouched = cache.tolist()
        loc.copy_(torch.tensor([0, 5], device="cuda"))
        graph.replay()
        replayed = cache.tolist()
    assert untouched == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0],
                         [10.0, 11.0]]
    assert replayed == [[-1.0, -1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0],
                        [-1.0, -1.0]]
    assert watcher.races == []


def _forked_graph_program(join: bool) -> list[float]:
    """A graph with a fork and a join inside, replayed on a side stream (both modes)."""
    shared = torch.zeros(8, device="cuda")
    total = torch.zeros((), device="cuda")
    branch = torch.cuda.Stream()
    done = torch.cuda.Event()
    (shared + 1).sum()  # warm-up: each kernel launched once before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        branch.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(branch):
            shared.add_(1)
            done.record()
        if join:
            torch.cuda.current_stream().wait_event(done)
        total.copy_(shared.sum())
        torch.cuda.current_stream().wait_event(done)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph.replay()
    torch.cuda.current_stream().wait_stream(side)
    return [total.item()]


def _graphed_callable_program(join: bool) -> list[float]:
    """make_graphed_callables' forward graph, its output read on another stream."""
    with torch.no_grad():
        graphed = torch.cuda.make_graphed_callables(lambda t: t * 2,
                                                    (torch.zeros(4, device="cuda"),))
        out = graphed(torch.ones(4, device="cuda"))
        reader = torch.cuda.Stream()
        if join:
            reader.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(reader):
            got = out + 1
        torch.cuda.current_stream().wait_stream(reader)
        return got.tolist()


def _summary(mode: str, program, join: bool) -> tuple[list[tuple[str, ...]], list[float]]:
    with watch(mode) as watcher:
        values = program(join)
    races = sorted((str(r.kind), r.buffer.split("@")[0], r.first.op_name, r.first.agent,
                    r.second.op_name, r.second.agent) for r in watcher.races)
    return races, values


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("program", [_forked_graph_program, _graphed_callable_program])
def test_graph_programs_in_cpu_mode(program, join):
    races, _values = _summary("cpu", program, join)
    assert bool(races) == (not join)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("program", [_forked_graph_program, _graphed_callable_program])
def test_gpu_mode_equals_cpu_mode_on_graphs(program, join):
    gpu = _summary("gpu", program, join)
    cpu = _summary("cpu", program, join)
    assert gpu[0] == cpu[0]
    if join:
        assert gpu[1] == cpu[1]


@declared(lambda result, out, table, rows: reads(rows) + reads(table, rows=rows) + writes(out))
def gather_rows_into(out, table, rows):
    """A gather kernel the dispatcher cannot see: ``out`` = the sum of ``table``'s rows named
    by the device tensor ``rows`` (its declaration reads those rows' values on the host)."""
    out.copy_(table[rows].sum(0))


def _replay_gather_then_write(row_written: int, ordered: bool):
    """Capture the gather with static ``rows`` = [0]; name row 2 before the replay; write
    ``row_written`` of ``table`` on a side stream after the replay."""
    with watch("cpu") as watcher:
        table = torch.zeros(4, 2, device="cuda")
        rows = torch.zeros(1, dtype=torch.int64, device="cuda")
        out = torch.zeros(2, device="cuda")
        side = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gather_rows_into(out, table, rows)
        rows.fill_(2)
        graph.replay()
        if ordered:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            table[row_written] = 5.0
        torch.cuda.synchronize()
    return watcher


def test_a_captured_declared_kernel_reads_the_rows_its_index_names_at_the_replay():
    """The replay reads row 2 (the static index's value then), not row 0 (at the capture):
    the unordered write of row 2 races it; the twin, ordered after the replay, does not."""
    racy = _replay_gather_then_write(row_written=2, ordered=False)
    assert _kinds(racy) == [("WAR", "table")]
    assert racy.races[0].first.op_name.startswith("graph.replay: gather_rows_into")
    assert _replay_gather_then_write(row_written=2, ordered=True).races == []


def test_a_captured_declared_kernel_does_not_read_the_rows_of_its_capture_again():
    """Row 0, which the index named only at the capture, is not read by the replay: writing
    it unordered is no race (the captured accesses would have called it one)."""
    watcher = _replay_gather_then_write(row_written=0, ordered=False)
    assert watcher.races == [] and watcher.unknown_ops == []


def _rows_listed(result, out, table, rows):
    """A declaration that reads its index values with ``tolist()`` (its own host read)."""
    return reads(rows) + [a for row in rows.tolist() for a in reads(table[row])] + writes(out)


@declared(_rows_listed)
def gather_listed_rows_into(out, table, rows):
    out.copy_(table[rows].sum(0))


@pytest.mark.parametrize("ordered", [False, True])
def test_a_declarations_own_host_reads_are_no_sync_of_the_program(ordered):
    """The declaration's ``tolist()`` is the recorder's, not the program's: it neither fails
    inside a capture nor orders the host after the kernel, so a read of its output on another
    stream races it unless that stream waits (the twin)."""
    with watch("cpu") as watcher:
        table = torch.ones(4, 2, device="cuda")
        rows = torch.tensor([1, 3], device="cuda")
        out = torch.zeros(2, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gather_listed_rows_into(out, table, rows)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            gather_listed_rows_into(out, table, rows)
        if ordered:
            torch.cuda.current_stream().wait_stream(side)
        copied = out * 1
        torch.cuda.synchronize()
        assert copied.tolist() == [2.0, 2.0]
    assert _kinds(watcher) == ([] if ordered else [("RAW", "out")])


def _indexed_writes_replayed(ordered: bool) -> list:
    """Two graphs each capturing an indexed write (``index_put_`` with a device index, whose
    rows are found again at each replay), replayed one after the other on one stream; then
    the first graph's table is read on another stream, ordered after the replays or not."""
    with watch("cpu") as watcher:
        replay_stream, reader = torch.cuda.Stream(), torch.cuda.Stream()
        first, second = torch.zeros(8, device="cuda"), torch.zeros(8, device="cuda")
        pool_rows = torch.tensor([1, 3], dtype=torch.int32, device="cuda")
        values = torch.ones(2, device="cuda")
        torch.cuda.synchronize()
        graphs = []
        for table in (first, second):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=replay_stream):
                rows = pool_rows.to(torch.int64)
                table[rows] = values
            graphs.append(graph)
        with torch.cuda.stream(replay_stream):
            for graph in graphs:
                graph.replay()
        with torch.cuda.stream(reader):
            if ordered:
                reader.wait_stream(replay_stream)
            first.sum()
        torch.cuda.synchronize()
    return watcher.races


def test_a_replayed_indexed_write_races_a_reader_on_another_stream():
    """Finding an indexed op's rows again at a replay reads the index on the host: the
    recorder's own work, which must not sync the host. It did, so the second graph's replay
    ordered the host (and the reader it launched next) after the first graph's write, and
    the race was hidden. The ordered reader is the fixed twin."""
    races = _indexed_writes_replayed(ordered=False)
    assert {(str(race.kind), race.buffer.split("@")[0]) for race in races} == {("RAW", "first")}
    assert _indexed_writes_replayed(ordered=True) == []
