"""Races vLLM fixed in Model Runner V2 after 0.28 (``released_races.py``), each run at the
release before its fix (races, both sides at the lines the fix is about, found by their text
in the file run) and at the release after (none). The release files come from the wheels
(``pip download --no-deps`` into the wheel cache): slow, skipped when a wheel cannot be had,
or where vLLM or the code an entry runs beside is missing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from overlap_harness.engines.vllm import historical

pytestmark = pytest.mark.slow
ENTRIES = {race.ref: race for race in historical.HISTORICAL}


def _line(source: str) -> str:
    file, _, line = source.rpartition(":")
    return Path(file).read_text().splitlines()[int(line) - 1].strip()


def _sides(ref: str, version: str, member: str | None = None) -> tuple[int, set]:
    race = ENTRIES[ref]
    if (reason := race.not_applicable()) is not None:
        pytest.skip(reason)
    member = member or race.member
    driver = race.driver
    with tempfile.TemporaryDirectory() as folder:
        try:
            source = historical.release_file(version, member, Path(folder), race.distribution)
        except VllmUnavailable as exc:
            pytest.skip(str(exc))
        watcher = driver(source)
        return len(watcher.races), {(str(r.kind), _line(r.first.source), _line(r.second.source))
                                    for r in watcher.races}


def test_the_pp_draft_broadcast_gathers_on_its_side_stream_before_0_33() -> None:
    count, sides = _sides("mrv2-pp-drafts (0.33.0)", "0.32.0")
    assert count > 0
    assert sides == {("WAR", "send = draft_tokens[input_batch.idx_mapping].contiguous()",
                      "draft_tokens[idx_mapping] = (sampled[:, 1:] + 1) % VOCAB  # the drafter")}
    assert _sides("mrv2-pp-drafts (0.33.0)", "0.33.0") == (0, set())


def test_the_fast_prefill_metadata_is_read_before_its_copy_lands_before_0_34() -> None:
    count, sides = _sides("fast-prefill-d2h (0.34.0)", "0.33.0")
    assert count > 0 and {kind for kind, _, _ in sides} == {"host-D2H"}
    assert {first for _, first, _ in sides} == {
        'query_start_loc_cpu=decode_query_start_loc.to("cpu", non_blocking=True),'}
    assert _sides("fast-prefill-d2h (0.34.0)", "0.34.0") == (0, set())


def test_encoder_only_steps_rewrite_the_ring_under_the_kernel_before_0_29() -> None:
    count, sides = _sides("#53176", "0.28.0")
    assert count > 0 and {kind for kind, _, _ in sides} == {"WAR"}
    assert "dst[:n] = x" in {second for _, _, second in sides}
    assert _sides("#53176", "0.29.0", historical.released_races.MM_ENCODER_RUNNER_FILE) == (
        0, set())
