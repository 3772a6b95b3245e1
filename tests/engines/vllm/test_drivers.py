"""vLLM's own async-scheduling code run under the recorder: race-free as released, and each
sync it relies on, removed in turn from vLLM's source, gives races at vLLM's own lines.
Skipped, with the import error, where vLLM is not installed (the ``vllm`` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:  # no vLLM here: every test of this file skips with the reason
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker.gpu.async_utils import AsyncOutput
from vllm.v1.worker.gpu_model_runner import (
    AsyncGPUModelRunnerOutput,
    GPUModelRunner,
)

from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.vllm import drivers


def race_lines(watcher) -> set[tuple[str, str, str, str]]:
    """(kind, buffer name, first file:line, second file:line), files by base name."""
    def short(source: str) -> str:
        file, _, line = source.rpartition(":")
        return f"{Path(file).name}:{line}"
    return {(str(r.kind), r.buffer.split("@")[0], short(r.first.source), short(r.second.source))
            for r in watcher.races}


@pytest.mark.parametrize("name", sorted(drivers.VARIANTS))
def test_vllm_as_released_is_race_free(name):
    watcher = drivers.VARIANTS[name].run()
    assert watcher.races == [] and watcher.unknown_ops == []


def test_v1_async_output_values_come_back_in_order():
    watcher = drivers.v1_async_output(steps=3)
    assert [o.sampled_token_ids for o in watcher.outputs] == [[[0], [0], [0]]] * 3
    assert all(o.logprobs is not None for o in watcher.outputs)


def test_v1_get_output_without_its_synchronize_reads_the_copy_too_early():
    target = site(AsyncGPUModelRunnerOutput, "get_output",
                  "self.async_copy_ready_event.synchronize()")
    with removed(target):
        races = race_lines(drivers.v1_async_output())
    copy_line = site(AsyncGPUModelRunnerOutput, "__init__", 'self._sampled_token_ids.to(')
    read_line = site(AsyncGPUModelRunnerOutput, "get_output",
                     "self.sampled_token_ids_cpu.tolist()")
    assert ("host-D2H", "self.sampled_token_ids_cpu", f"gpu_model_runner.py:{copy_line.line}",
            f"gpu_model_runner.py:{read_line.line}") in races
    assert any(kind == "reuse" for kind, *_rest in races)  # freed after get_output's del


def test_v1_copy_stream_without_wait_stream_reads_unsampled_ids():
    with removed(site(AsyncGPUModelRunnerOutput, "__init__",
                      "async_output_copy_stream.wait_stream(default_stream)")):
        races = race_lines(drivers.v1_async_output())
    copy_line = site(AsyncGPUModelRunnerOutput, "__init__", 'self._sampled_token_ids.to(')
    assert any(kind == "RAW" and second == f"gpu_model_runner.py:{copy_line.line}"
               for kind, _buffer, _first, second in races)  # the sampler's write, unordered


@pytest.mark.parametrize("needle", ["self.prepare_inputs_event.synchronize()",
                                    "self.prepare_inputs_event.record()"])
def test_v1_input_prep_fence_is_necessary(needle):
    with removed(site(GPUModelRunner, "synchronize_input_prep", needle)):
        races = race_lines(drivers.v1_input_prep())
    copy = site(__import__("vllm.v1.utils", fromlist=["CpuGpuBuffer"]).CpuGpuBuffer,
                "copy_to_gpu", "non_blocking=True")
    assert races and all(first == f"utils.py:{copy.line}" for _k, _b, first, _s in races)


def test_mrv2_uva_ring_shallower_than_the_steps_in_flight_races():
    from vllm.v1.worker.gpu import buffer_utils

    races = race_lines(drivers.mrv2_step(ring_depth=1))
    launch = site(buffer_utils.StagedWriteTensor, "apply_write", "_apply_write_kernel[")
    rewrite = site(buffer_utils.UvaBufferPool, "copy_to_uva", "dst[:n] = x")
    assert races == {("WAR", "self.cpu", f"buffer_utils.py:{launch.line}",
                      f"buffer_utils.py:{rewrite.line}")}
    assert drivers.mrv2_step(ring_depth=3).races == []


@pytest.mark.parametrize("attribute,needle,kinds", [
    ("__init__", "copy_stream.wait_stream(main_stream)", {"RAW", "WAR", "reuse"}),
    ("get_output", "self.copy_event.synchronize()", {"host-D2H", "WAR", "reuse"}),
])
def test_mrv2_async_output_syncs_are_necessary(attribute, needle, kinds):
    with removed(site(AsyncOutput, attribute, needle)):
        races = race_lines(drivers.mrv2_step())
    assert {kind for kind, *_rest in races} == kinds


def test_pipeline_parallel_batch_queue_without_async_scheduling_has_an_empty_fence():
    """vLLM 0.32's ``__init__`` makes ``prepare_inputs_event`` only with async scheduling, so
    a pipeline-parallel batch queue (two steps in flight) without it rewrites the staging
    buffers under step N-1's pending copies: the race of vLLM PR #47644 (open)."""
    from vllm.v1.utils import CpuGpuBuffer

    races = race_lines(drivers.v1_input_prep(async_scheduling=False))
    copy = site(CpuGpuBuffer, "copy_to_gpu", "non_blocking=True")
    assert races and {(kind, first) for kind, _b, first, _s in races} == {
        ("host-D2H", f"utils.py:{copy.line}")}
    assert drivers.v1_input_prep(async_scheduling=True).races == []


def test_mrv2_pooling_unbind_before_synchronize_is_not_a_race():
    """vLLM issue #36942 reads ``get_output()``'s ``unbind()`` before ``synchronize()`` as a
    race; ``unbind`` makes views and reads nothing, so the recorder finds none, while the
    synchronize itself is necessary (the engine's read of the vectors races without it)."""
    from vllm.v1.worker.gpu.async_utils import AsyncPoolingOutput

    unbind = site(AsyncPoolingOutput, "get_output", ".unbind(dim=0)")
    fence = site(AsyncPoolingOutput, "get_output", "self.copy_event.synchronize()")
    assert unbind.line < fence.line
    watcher = drivers.mrv2_pooling()
    assert watcher.races == [] and watcher.outputs[0] == [[2.0] * 4] * 3
    with removed(fence):
        assert {str(r.kind) for r in drivers.mrv2_pooling().races} >= {"host-D2H"}


def test_v1_spec_decode_counts_and_drafts_reach_the_host_after_their_events():
    watcher = drivers.v1_spec_decode(steps=3)
    counts, drafts = watcher.outputs
    assert counts == [[], [3, 3, 3], [3, 3, 3]]
    assert all(d is not None and len(d.draft_token_ids) == 3 for d in drafts)
    with removed(site(GPUModelRunner, "_get_valid_sampled_token_count",
                      "sampled_count_event.synchronize()")):
        racy = race_lines(drivers.v1_spec_decode(steps=3))
    read = site(GPUModelRunner, "_get_valid_sampled_token_count", "counts_cpu[:")
    assert any(kind == "host-D2H" and second == f"gpu_model_runner.py:{read.line}"
               for kind, _b, _f, second in racy)
