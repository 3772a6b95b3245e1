"""vLLM's engine core decides the steps in flight: ``EngineCore.step_with_batch_queue`` with
the real ``AsyncScheduler`` and ``UniProcExecutor`` over a worker made of Model Runner V2's
own ``StagedWriteTensor`` (the UVA ring) and ``AsyncOutput``. The ring is safe exactly while
its depth covers the batch queue. Skipped with the import error where vLLM is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker.gpu import buffer_utils

from overlap_harness.engines.core.mutation import site
from overlap_harness.engines.vllm.engine_core import engine_steps


@pytest.mark.parametrize("queue,ring", [(2, None), (3, 3), (1, 1)])
def test_the_engine_finishes_every_request_race_free_when_the_ring_covers_the_queue(queue,
                                                                                   ring):
    watcher = engine_steps(batch_queue_size=queue, ring_depth=ring)
    assert watcher.finished == {"req0", "req1", "req2"}
    assert watcher.races == [] and watcher.unknown_ops == []


@pytest.mark.parametrize("queue,ring", [(2, 1), (3, 2)])
def test_a_ring_shallower_than_the_batch_queue_races_at_vllms_lines(queue, ring):
    watcher = engine_steps(batch_queue_size=queue, ring_depth=ring)
    launch = site(buffer_utils.StagedWriteTensor, "apply_write", "_apply_write_kernel[")
    rewrite = site(buffer_utils.UvaBufferPool, "copy_to_uva", "dst[:n] = x")
    assert {(str(r.kind), f"{Path(r.first.source).name}", f"{Path(r.second.source).name}")
            for r in watcher.races} == {
        ("WAR", f"buffer_utils.py:{launch.line}", f"buffer_utils.py:{rewrite.line}")}


def test_every_sync_statement_on_the_driven_paths_is_necessary_where_reached():
    from overlap_harness.engines.vllm import necessity

    names = list(necessity.variant_runs())
    baseline = {name: necessity.run_outcome(name) for name in names}
    assert all(not o.races and o.error is None for o in baseline.values())
    rows = necessity.table(names, baseline, jobs=2)
    reached = [r for r in rows if r.verdict != "not_reached"]
    # per variant, the syncs of the functions it drives (the spec-decode and chunked-prefill
    # variants also run the V1 async output's three); every reached row is necessary but
    # three of the pipeline's: the first stage's receive orders its side stream after the
    # main stream and also record_streams what it made there, each alone enough here; the
    # graph variant also reaches the capture stream's wait in GroupCoordinator.graph_capture
    per_variant = {name: sum(r.variant == name for r in reached) for name in names}
    assert per_variant == {"v1-async-output": 3, "v1-input-prep": 2, "mrv2-uva-ring": 3,
                           "v1-pooling": 3, "mrv2-pooling": 3, "v1-spec-decode": 9,
                           "engine-core": 3, "chunked-prefill": 5, "mrv2-spec-decode": 10,
                           "pp-batch-queue": 9, "v1-hybrid-spec-decode": 7,
                           "v1-hybrid-spec-decode-sync": 5,
                           "v1-hybrid-spec-decode-async-none": 6,
                           "mrv2-encoder-only": 2, "mrv2-cuda-graphs": 4}
    redundant = {(Path(r.site).name.split(":")[0], r.code, r.variant) for r in reached
                 if r.verdict == "redundant"}
    # and the accepted-token event where nothing reads the counts before a host sync: without
    # async scheduling (each output taken first), or async without align (no host read)
    accepted = "self.num_accepted_tokens_event."
    assert redundant == {
        ("pp_utils.py", "self.broadcast_stream.wait_stream(self.main_stream)", "pp-batch-queue"),
        ("pp_utils.py", "sampled_tokens.record_stream(self.main_stream)", "pp-batch-queue"),
        ("pp_utils.py", "combined.record_stream(self.main_stream)", "pp-batch-queue"),
        ("gpu_model_runner.py", f"{accepted}synchronize()", "v1-hybrid-spec-decode-sync"),
        ("gpu_model_runner.py", f"{accepted}record()", "v1-hybrid-spec-decode-sync"),
        ("gpu_model_runner.py", f"{accepted}record()", "v1-hybrid-spec-decode-async-none")}
    assert {r.verdict for r in reached} == {"necessary", "redundant"}
    assert all(r.site.split("/site-packages/")[-1].startswith("vllm/") for r in rows)
    assert all(race["first"]["file"] and race["second"]["file"]
               for r in reached for race in r.races)
