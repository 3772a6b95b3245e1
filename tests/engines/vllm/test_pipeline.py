"""A pipeline-parallel batch queue with async scheduling in one process: vLLM's engine core
keeps ``pp_size + 1`` batches in flight (its own config's answer for Model Runner V2), the
real ``AsyncScheduler`` spaces each request's decodes, and two stage ranks run vLLM's
``PPHandler`` (the last rank broadcasts the sampled ids on a side stream, the first consumes
them ``pp_size`` steps later after ``wait_event``). Race-free as released; its syncs,
removed from vLLM's source, give races at vLLM's lines (verdicts by the detector). Skipped
without vLLM."""

from __future__ import annotations

import inspect

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker.gpu.pp_utils import PPHandler

from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.vllm.pipeline import PP_SIZE, FakeBroadcast, pp_batch_queue_steps
from tests.engines.vllm.race_pairs import pairs


def test_the_pipeline_keeps_pp_size_plus_one_batches_in_flight_and_is_race_free():
    watcher = pp_batch_queue_steps()
    assert watcher.queue == PP_SIZE + 1
    assert watcher.finished == {"req0", "req1", "req2"}
    assert watcher.races == [] and watcher.unknown_ops == []


def _broadcast_fill() -> str:
    """Where the first stage's received tensor gets its values: the harness's stand-in for
    ``torch.distributed.broadcast`` (the ``torch.empty`` before it writes no value)."""
    source, start = inspect.getsourcelines(FakeBroadcast.__call__)
    return f"pipeline.py:{start + next(i for i, line in enumerate(source) if '_receive(' in line)}"


def test_without_wait_event_the_first_stage_reads_the_broadcast_before_it_lands():
    consume = site(PPHandler, "get_prev_sampled_outputs", "self.main_stream.wait_event(")
    with removed(consume):
        racy = pairs(pp_batch_queue_steps())
    # the first side is the broadcast that fills the received tensor
    assert any(kind == "RAW" and first == _broadcast_fill()
               for kind, first, _second in racy)


@pytest.mark.parametrize("needle", ["self.broadcast_stream.wait_stream(self.main_stream)",
                                    "tensor.record_stream(self.broadcast_stream)"])
def test_the_last_ranks_broadcast_needs_its_wait_and_its_record_stream(needle):
    with removed(site(PPHandler, "broadcast", needle)):
        racy = pairs(pp_batch_queue_steps())
    pad = site(PPHandler, "broadcast", "torch.nn.functional.pad(")
    assert racy and any(f"pp_utils.py:{pad.line}" in (first, second)
                        for _kind, first, second in racy)


def test_the_receives_wait_and_record_stream_are_redundant_alone_but_not_together():
    """The necessity table calls each of the two redundant (each alone keeps the side
    stream's allocation from reusing memory the main stream still reads); removed together,
    the first stage's broadcast buffer is reused under its pending read."""
    wait = site(PPHandler, "receive", "self.broadcast_stream.wait_stream(self.main_stream)")
    keep = site(PPHandler, "receive", "sampled_tokens.record_stream(self.main_stream)")
    for alone in (wait, keep):
        with removed(alone):
            assert pp_batch_queue_steps().races == []
    with removed(wait, keep):
        racy = pairs(pp_batch_queue_steps())
    assert racy and {kind for kind, _f, _s in racy} == {"reuse"}
    # the new owner's first write, the broadcast into the reused block
    assert any(second == _broadcast_fill() for _k, _f, second in racy)


def test_the_last_stages_output_without_its_synchronize_races_at_vllms_own_lines():
    from vllm.v1.worker.gpu import async_utils

    with removed(site(async_utils.AsyncOutput, "get_output", "self.copy_event.synchronize()")):
        racy = pairs(pp_batch_queue_steps())
    copy = site(async_utils, "async_copy_to_np", 'non_blocking=True')
    read = site(async_utils.AsyncOutput, "get_output", "self.sampled_token_ids.tolist()")
    assert ("host-D2H", f"async_utils.py:{copy.line}", f"async_utils.py:{read.line}") in racy


@pytest.mark.parametrize("ring,racy", [(None, False), (2, True)])
def test_a_chunked_prompt_needs_the_uva_ring_as_deep_as_the_pipelines_queue(ring, racy):
    """A 16-token prompt prefilled 4 tokens a step stages a new block-table row write in
    every step; with three batches in flight a ring of 2 slots is rewritten under the write
    kernel of the step before last, vLLM's own depth (the queue's, 3) is not."""
    from vllm.v1.worker.gpu import buffer_utils

    watcher = pp_batch_queue_steps(prompts=[list(range(1, 17))], token_budget=4,
                                   ring_depth=ring)
    assert watcher.finished == {"req0"} and watcher.queue == PP_SIZE + 1
    launch = site(buffer_utils.StagedWriteTensor, "apply_write", "_apply_write_kernel[")
    rewrite = site(buffer_utils.UvaBufferPool, "copy_to_uva", "dst[:n] = x")
    expected = {("WAR", f"buffer_utils.py:{launch.line}", f"buffer_utils.py:{rewrite.line}")}
    assert pairs(watcher) == (expected if racy else set())
