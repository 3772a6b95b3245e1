"""Model Runner V2's CUDA graphs under the recorder: vLLM's ``CudaGraphManager`` captures a
FULL decode graph of the (fake) forward and replays it every step between the staged writes
and the async output copy. Race-free as released; every step is replayed; the replays give
the values the same steps give eagerly (no graph captured); and the capture stream's wait
in vLLM's ``GroupCoordinator.graph_capture`` is what orders the capture after the static
buffers' making. Skipped without vLLM, or on a tree without Model Runner V2's graphs."""

from __future__ import annotations

from tests.engines.vllm.applicable import require_variant

require_variant("mrv2-cuda-graphs")

from vllm.distributed.parallel_state import GroupCoordinator  # noqa: E402 - after the skip

from overlap_harness.engines.core.mutation import removed, site  # noqa: E402
from overlap_harness.engines.vllm.cuda_graphs import cuda_graph_steps  # noqa: E402


def test_the_graph_is_captured_and_replayed_race_free() -> None:
    watcher = cuda_graph_steps()
    assert watcher.races == [] and watcher.unknown_ops == []
    assert watcher.modes == ["FULL"] * 5


def test_replays_give_the_eager_values() -> None:
    graphed, eager = cuda_graph_steps(), cuda_graph_steps(capture=False)
    assert eager.modes == ["NONE"] * 5
    assert graphed.outputs == eager.outputs
    assert len({str(o) for o in graphed.outputs}) > 1  # the steps' values differ


def test_without_the_capture_streams_wait_the_capture_reads_unordered_buffers() -> None:
    wait = site(GroupCoordinator, "graph_capture", "stream.wait_stream(curr_stream)")
    with removed(wait):
        watcher = cuda_graph_steps()
    assert watcher.races
    assert "RAW" in {str(r.kind) for r in watcher.races}  # (and WAW on the static outputs)
    # the warm-up on the capture stream vs the buffers' making on the default stream
    assert "default" not in {r.second.agent for r in watcher.races}
    assert {r.first.agent for r in watcher.races} == {"default"}
