"""The installed V1 runner's ``_prepare_inputs``, ``_build_attention_metadata`` and
``_update_states_after_model_execute`` with spec decode on a hybrid (GDN) model: race-free as
released in each configuration; with ``num_accepted_tokens_event.synchronize()`` (or the
record before it) removed from vLLM's own function, async scheduling with
``mamba_cache_mode="align"`` races at vLLM's lines (#36013 reintroduced), while the
configurations that never run the synchronize, or that sync the host on each step's output,
do not. Lines are found by their text in vLLM's source, not taken from the driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from vllm.v1.worker import mamba_utils
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from overlap_harness.engines.core.mutation import removed, site
from overlap_harness.engines.vllm import hybrid_spec_decode
from tests.engines.vllm.race_pairs import pairs

CONFIGURATIONS = {"async-align": dict(async_scheduling=True, mamba_cache_mode="align"),
                  "async-none": dict(async_scheduling=True, mamba_cache_mode="none"),
                  "sync-none": dict(async_scheduling=False, mamba_cache_mode="none"),
                  "sync-align": dict(async_scheduling=False, mamba_cache_mode="align")}
SYNCHRONIZE = site(GPUModelRunner, "_prepare_inputs", "num_accepted_tokens_event.synchronize()")
ALIGN_RECORD = site(GPUModelRunner, "_update_states_after_model_execute",
                    "num_accepted_tokens_event.record()", 1)


def expected_pairs() -> set[tuple[str, str, str]]:
    """The align path's D2H of the counts (mamba_utils) against ``_prepare_inputs``' host read
    of them (a NumPy gather) and its host write-back of them."""
    copy = site(mamba_utils, "postprocess_mamba_align_gpu",
                "num_accepted_tokens_cpu_tensor[:num_reqs].copy_(")
    read = site(GPUModelRunner, "_prepare_inputs", "self.input_batch.num_accepted_tokens_cpu[",
                1)
    write = site(GPUModelRunner, "_prepare_inputs",
                 "self.input_batch.num_accepted_tokens_cpu[:num_reqs] = (")
    first = f"{Path(copy.file).name}:{copy.line}"
    return {("host-D2H", first, f"{Path(read.file).name}:{line}")
            for line in (read.line, write.line)}


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_race_free_as_released(name):
    watcher = hybrid_spec_decode.hybrid_spec_decode_steps(**CONFIGURATIONS[name])
    assert watcher.races == [] and watcher.unknown_ops == []


@pytest.mark.parametrize("removed_site", [SYNCHRONIZE, ALIGN_RECORD],
                         ids=["synchronize", "record"])
def test_async_align_without_the_event_reads_the_counts_before_the_copy(removed_site):
    with removed(removed_site):
        watcher = hybrid_spec_decode.hybrid_spec_decode_steps()
    assert pairs(watcher) == expected_pairs()


@pytest.mark.parametrize("name", ["async-none", "sync-none", "sync-align"])
def test_without_the_synchronize_the_other_configurations_stay_clean(name):
    """async-none never runs it (no host read of the counts); without async scheduling the
    previous step's output is taken, with its host sync, before the next step is prepared."""
    with removed(SYNCHRONIZE):
        watcher = hybrid_spec_decode.hybrid_spec_decode_steps(**CONFIGURATIONS[name])
    assert watcher.races == []


def test_the_synchronize_runs_only_when_not_async_without_align():
    """Its reach counted by the core's table (the statement removed counts its executions):
    reached and necessary under async scheduling with align, reached and redundant without
    async scheduling, never reached under async scheduling without align."""
    from overlap_harness.engines.core.necessity import necessity_table
    from overlap_harness.engines.vllm import necessity

    names = ["v1-hybrid-spec-decode", "v1-hybrid-spec-decode-sync",
             "v1-hybrid-spec-decode-async-none"]
    [sync_site] = [s for s in necessity.sites()
                   if s.file == SYNCHRONIZE.file and s.line == SYNCHRONIZE.line]
    baseline = {name: necessity.run_outcome(name) for name in names}
    assert all(not o.races and o.error is None for o in baseline.values())
    rows = {row.variant: row for row in necessity_table(
        [sync_site], names, baseline, necessity.run_outcome)}
    assert {name: row.verdict for name, row in rows.items()} == {
        "v1-hybrid-spec-decode": "necessary", "v1-hybrid-spec-decode-sync": "redundant",
        "v1-hybrid-spec-decode-async-none": "not_reached"}
    assert rows["v1-hybrid-spec-decode"].reached > 0 == rows[
        "v1-hybrid-spec-decode-async-none"].reached
