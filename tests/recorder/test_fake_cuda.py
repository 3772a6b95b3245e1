"""CPU mode: CUDA faked on CPU tensors, patches undone, sites in the user's code, declared and
unknown kernels, the project's Triton gather."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import overlap_harness
from overlap_harness.model.kernels.gather import gather_spec_extras
from overlap_harness.recorder import RecorderError, declare_kernel, declared, reads, watch, writes
from overlap_harness.recorder.fake_streams import FakeStream

ORIGINAL_STREAM = torch.cuda.Stream
ORIGINAL_IS_AVAILABLE = torch.cuda.is_available


def line_of(function, needle: str) -> int:
    """The line number of the first line of ``function`` that contains ``needle``."""
    lines, start = inspect.getsourcelines(function)
    for offset, text in enumerate(lines):
        if needle in text:
            return start + offset
    raise AssertionError(f"{needle!r} not in {function.__name__}")


def test_device_tensors_look_like_cuda_and_compute_on_the_cpu():
    with watch("cpu"):
        x = torch.arange(4, device="cuda")
        y = (x * 2).to(torch.float64)
        made_like = torch.zeros(2, device=x.device)
        built = x.new_tensor([1, 2])
        seen = [t.device.type for t in (x, y, made_like, built)] + [x.is_cuda, x.get_device()]
        back = y.cpu()
        assert back.device.type == "cpu" and not back.is_cuda
        back[0] = 100.0  # a copy: the device tensor keeps its value
        assert y.tolist() == [0.0, 2.0, 4.0, 6.0]
    assert seen == ["cuda", "cuda", "cuda", "cuda", True, 0]


def test_patches_are_undone_on_exit_and_on_an_exception():
    assert "TRITON_INTERPRET" not in os.environ
    with pytest.raises(ZeroDivisionError), watch("cpu"):
        assert torch.cuda.Stream is FakeStream and torch.cuda.is_available()
        assert os.environ["TRITON_INTERPRET"] == "1"
        raise ZeroDivisionError
    assert torch.cuda.Stream is ORIGINAL_STREAM
    assert torch.cuda.is_available is ORIGINAL_IS_AVAILABLE
    assert "record_stream" not in vars(torch.Tensor)
    assert "TRITON_INTERPRET" not in os.environ
    assert torch.zeros(2).device.type == "cpu"
    with watch("cpu") as watcher:
        torch.ones(2, device="cuda")
    assert torch.cuda.Stream is ORIGINAL_STREAM
    ops = len(watcher.run.timeline)
    torch.ones(2).add_(1)  # nothing is recorded after the block
    assert len(watcher.run.timeline) == ops


def test_unknown_mode_and_gpu_mode_without_cuda_are_clear_errors():
    with pytest.raises(RecorderError, match=re.escape("expected one of auto|cpu|gpu, got 'fast'")):
        watch("fast")
    if not ORIGINAL_IS_AVAILABLE():
        with pytest.raises(RecorderError, match="mode 'gpu' needs a CUDA device"):
            watch("gpu")


def test_nested_watch_is_refused_and_the_outer_one_goes_on():
    with watch("cpu") as outer:
        with pytest.raises(RecorderError, match="do not nest"), watch("cpu"):
            pass
        torch.ones(2, device="cuda")
    assert [n.name for n in outer.recording.detector.nodes] == ["ones"]
    with watch("cpu"):  # and a new one can start after
        pass


def racy_program() -> None:
    side = torch.cuda.Stream()
    data = torch.zeros(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        data.fill_(1)  # site: producer
    data.sum()  # site: consumer


def test_race_sites_are_the_users_lines_and_names_the_users_variables():
    with watch("cpu") as watcher:
        racy_program()
    (race,) = watcher.races
    here = inspect.getsourcefile(racy_program)
    assert race.first.source.endswith(f"{here.rsplit('/', 1)[-1]}:"
                                      f"{line_of(racy_program, 'site: producer')}")
    assert race.second.source.endswith(f":{line_of(racy_program, 'site: consumer')}")
    assert (race.first.agent, race.second.agent) == ("side", "default")
    assert race.buffer == f"data@test_fake_cuda.py:{line_of(racy_program, 'data = torch')}"
    assert watcher.buffer_sites[race.buffer].endswith(f":{line_of(racy_program, 'data = ')}")


def test_elapsed_time_counts_nodes_between_records():
    with watch("cpu"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.ones(3, device="cuda").add_(1)
        end.record()
        elapsed = start.elapsed_time(end)
    assert elapsed == pytest.approx(0.003)  # ones, add_, the end record: 1 µs each


def test_data_ptr_of_device_memory_is_an_op_of_unknown_access():
    with watch("cpu") as watcher:
        buf = torch.zeros(4, device="cuda")
        buf.data_ptr()  # what a raw kernel launch does
    (unknown,) = watcher.unknown_ops
    assert (unknown.name, unknown.stream, unknown.tensors[0].split("@")[0]) == (
        "data_ptr", "default", "buf")


@declared(lambda out, table, rows: reads(table, rows=rows) + writes(out))
def raw_gather(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    out = torch.empty(rows.shape[0], table.shape[1], device=table.device)
    out.copy_(table[rows])
    out.data_ptr()  # inside a declared kernel: not unknown
    return out


@pytest.mark.parametrize(("written_row", "races"), [(1, 1), (2, 0)])
def test_declared_kernel_reads_only_its_rows(written_row, races):
    with watch("cpu") as watcher:
        side = torch.cuda.Stream()
        table = torch.arange(12.0, device="cuda").reshape(4, 3)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            table[written_row].fill_(-1)
        got = raw_gather(table, torch.tensor([3, 1], device="cuda"))
    assert len(watcher.races) == races and not watcher.unknown_ops
    assert [r.second.op_name for r in watcher.races] == ["raw_gather"] * races
    expected_row_1 = [-1.0] * 3 if written_row == 1 else [3.0, 4.0, 5.0]
    assert got.tolist() == [[9.0, 10.0, 11.0], expected_row_1]  # values in issue order


@pytest.mark.parametrize(("written_row", "races"), [(3, 1), (2, 0)])
def test_project_triton_gather_is_declared_and_runs_on_the_cpu(written_row, races):
    with watch("cpu") as watcher:
        side = torch.cuda.Stream()
        topk_p = torch.rand(6, 2, device="cuda")
        topk_index = torch.randint(0, 9, (6, 2), device="cuda")
        tokens = torch.arange(6, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            tokens[written_row] = 40
        out = gather_spec_extras(torch.tensor([1, 3], device="cuda"), topk_p, topk_index,
                                 tokens, None, impl="triton")
    assert out.bonus_tokens.tolist() == [1, 40 if written_row == 3 else 3]
    assert [(str(r.kind), r.second.op_name) for r in watcher.races] == [
        ("RAW", "gather_triton")] * races
    assert not watcher.unknown_ops


def test_common_torch_cuda_calls_run_in_cpu_mode():
    with watch("cpu") as watcher:
        torch.manual_seed(0)
        torch.cuda.manual_seed_all(0)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.nvtx.range_push("step")
        with torch.cuda.device(0):
            torch.cuda.empty_cache()
        torch.cuda.nvtx.range_pop()
        named = [torch.cuda.get_device_name(), torch.cuda.device_count(),
                 torch.cuda.current_stream().name, torch.cuda.default_stream().name]
    assert named == ["fake CUDA device (overlap-harness CPU mode)", 1, "default", "default"]
    assert watcher.races == [] and watcher.run.timeline == []


class LaunchLikeTriton:
    """Stands in for a Triton ``JITFunction``: ``kernel[grid](*args)`` calls ``run``."""

    __name__ = "fill_rows_kernel"

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.run(*args, grid=grid, **kwargs)

    def run(self, out, rows, *, grid):
        out.data_ptr()  # what a real launch does with each tensor argument
        out[rows] = 1.0  # the values, as the kernel would compute them


def test_a_kernel_object_with_run_is_declared_by_its_rows():
    kernel = LaunchLikeTriton()
    declare_kernel(kernel, lambda result, out, rows, grid: writes(out, rows=rows))
    with watch("cpu") as watcher:
        side = torch.cuda.Stream()
        out = torch.zeros(4, 2, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out[3].fill_(5)
        kernel[(1,)](out, torch.tensor([0, 3], device="cuda"))
    assert "run" not in vars(kernel)  # the wrapper is gone after the block
    assert [(str(r.kind), r.second.op_name, r.elements) for r in watcher.races] == [
        ("WAW", "fill_rows_kernel", (6, 7))]
    assert not watcher.unknown_ops and out.tolist() == [[1.0, 1.0], [0, 0], [0, 0], [1.0, 1.0]]


def test_the_command_line_and_package_import_no_torch():
    code = ("import sys, overlap_harness, overlap_harness.check_cmd, overlap_harness.pytest_races;"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout
    assert out.strip() == "False"
    assert overlap_harness.watch is watch


def _reused_context_loop(steps: int, barrier: bool) -> None:
    """One ``torch.cuda.stream`` object entered every iteration (SGLang's forward_stream_ctx),
    nested inside a second entry of itself; the side stream writes, the default stream reads."""
    side = torch.cuda.Stream()
    side_ctx = torch.cuda.stream(side)
    out = torch.zeros(4, device="cuda")
    for step in range(steps):
        if barrier:  # the last iteration's read is done before the side stream rewrites
            side.wait_stream(torch.cuda.current_stream())
        with side_ctx:
            with side_ctx:
                out.fill_(step)  # site: writer
            assert torch.cuda.current_stream() is side
        assert torch.cuda.current_stream() is torch.cuda.default_stream()
        if barrier:
            torch.cuda.current_stream().wait_stream(side)
        out.sum().item()  # site: reader


@pytest.mark.parametrize("barrier", [False, True])
def test_a_stream_context_object_is_reusable_and_nests(barrier):
    with watch("cpu") as watcher:
        _reused_context_loop(3, barrier)
    lines = {(race.first.source.rsplit(":", 1)[1], race.second.source.rsplit(":", 1)[1])
             for race in watcher.races}
    if barrier:
        assert watcher.races == []
    else:
        writer, reader = (line_of(_reused_context_loop, "site: writer"),
                          line_of(_reused_context_loop, "site: reader"))
        assert (str(writer), str(reader)) in lines


def test_a_paused_dispatch_records_nothing_not_even_a_blocking_copy():
    """With the dispatch paused (the overhead benchmark's baseline), an op torch builds outside
    the dispatcher is not taken for ``torch.tensor(host data, device=...)``: no op, no host
    sync (which inside a graph capture would be refused). Unpaused, the same index op is
    recorded."""
    def recorded_by_index(paused: bool, in_capture: bool) -> int:
        with watch("cpu") as watcher:
            table = torch.arange(8.0, device="cuda")
            ids = torch.zeros(4, dtype=torch.int64, device="cuda")
            graph = torch.cuda.CUDAGraph()
            watcher.dispatch.paused += paused
            if in_capture:
                with torch.cuda.graph(graph):
                    before = len(watcher.run.timeline)
                    table[ids]
                    after = len(watcher.run.timeline)
            else:
                before = len(watcher.run.timeline)
                table[ids]
                after = len(watcher.run.timeline)
            watcher.dispatch.paused -= paused
            return after - before

    assert recorded_by_index(paused=True, in_capture=True) == 0
    assert recorded_by_index(paused=True, in_capture=False) == 0
    assert recorded_by_index(paused=False, in_capture=False) > 0
