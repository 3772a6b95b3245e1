"""The committed loop reports' rows are what a fresh run writes (reports/conformance/
sglang-0.5.2x-loop.json), compared through :mod:`~overlap_harness.engines.sglang.report.
row_compare`: the row's variant, site, verdicts and SGLang-side race locations exactly, a
race side in the harness's own files by its op and stream, not by the file and line where
the harness keeps it (those move with the harness's layout).

Cheap: the normalisation itself, and a fresh run of two variants on the installed SGLang
against the committed 0.5.23 report. Slow: every row of 0.5.20, 0.5.22 and 0.5.23.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.sglang import releases
from overlap_harness.engines.sglang.report import row_compare

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "overlap_harness" / "engines" / "sglang"
COMMITTED = {version: ROOT / "reports" / "conformance" / f"sglang-{version}-loop.json"
             for version in ("0.5.20", "0.5.22", "0.5.23")}

RAW = ("WAR self.req_to_token@memory_pool.py:406: model_forward on self.forward_stream at "
       "{harness}:{line} / copy_ on self.schedule_stream at "
       "sglang/srt/mem_cache/memory_pool.py:{sglang_line}")


def _example(harness: str = "/work/main/overlap_harness/engines/sglang/worker.py",
             line: int = 158, sglang_line: int = 414) -> str:
    return RAW.format(harness=harness, line=line, sglang_line=sglang_line)


def test_a_harness_side_compares_by_its_op_not_by_where_the_harness_keeps_it() -> None:
    moved = _example("/tmp/x/overlap_harness/engines/sglang/stand_ins/model_worker.py", 160)
    assert row_compare.normalised(_example()) == row_compare.normalised(moved)
    assert row_compare.HARNESS_MARK in row_compare.normalised(moved)
    # SGLang's side is compared exactly, and so is the harness side's op
    assert row_compare.normalised(_example()) != row_compare.normalised(
        _example(sglang_line=415))
    assert row_compare.normalised(_example()) != row_compare.normalised(
        _example().replace("model_forward", "model_forward_in_graph"))


def test_differences_name_the_row_and_the_field() -> None:
    row = {"variant": "radix_cache", "site": "sglang/srt/managers/scheduler.py:2021",
           "real": "race", "race_examples": [_example()]}
    moved = dict(row, race_examples=[_example(
        "/y/overlap_harness/engines/sglang/stand_ins/model_worker.py", 3)])
    assert row_compare.differences({"rows": [row]}, {"rows": [moved]}) == []
    changed = dict(moved, real="race_free")
    assert row_compare.differences({"rows": [row]}, {"rows": [changed]}) == [
        "('radix_cache', 'sglang/srt/managers/scheduler.py:2021') real: 'race' -> "
        "'race_free'"]
    assert row_compare.differences({"rows": [row]}, {"rows": []}) == [
        "('radix_cache', 'sglang/srt/managers/scheduler.py:2021'): missing"]


def test_an_allocator_reuse_race_and_the_race_count_are_not_compared() -> None:
    """Which freed buffer an allocation reuses first varies between runs of the same code
    (row_compare's docstring); every other race example and field still is compared."""
    reuse = ("reuse prefix_lens_device@allocation.py:401: _to_copy on self.schedule_stream at "
             "sglang/srt/mem_cache/allocation.py:401 / k on plan_stream at sglang/a.py:1")
    row = {"variant": "v", "site": "s", "real": "race", "races": 2,
           "race_examples": [reuse, _example()]}
    other_reuse = dict(row, races=3, race_examples=[
        reuse.replace("prefix_lens_device@allocation.py:401", "extend_lens_device@allocation."
                      "py:402"), _example()])
    assert row_compare.differences({"rows": [row]}, {"rows": [other_reuse]}) == []
    other_race = dict(row, race_examples=[reuse, _example(sglang_line=415)])
    assert row_compare.differences({"rows": [row]}, {"rows": [other_race]}) != []


def test_a_graph_captured_ops_harness_file_is_not_compared() -> None:
    captured = ("WAR x@memory_pool.py:406: graph.replay: attn_metadata_prep_in_graph (captured at "
                "{}) on self.forward_stream at sglang/srt/a.py:232 / copy_ on s at sglang/b.py:1")
    assert (row_compare.normalised(captured.format("graph_runner.py:178"))
            == row_compare.normalised(captured.format("graph_model.py:147")))


@pytest.mark.parametrize("version", sorted(COMMITTED))
def test_every_harness_side_of_a_committed_report_is_a_stand_in_file(version: str) -> None:
    """A race side in harness code names a file of stand_ins/ as the package is now (what
    stands in for SGLang's own code, visibly), never a feature or the driver."""
    named = row_compare.harness_files(json.loads(COMMITTED[version].read_text()))
    assert named
    assert [path for path in sorted(named) if not (PACKAGE / path).is_file()] == []
    assert [path for path in sorted(named) if not path.startswith("stand_ins/")] == []


def _fresh(tmp_path: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--necessity",
                           "-q", "--loop-report", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    [written] = tmp_path.glob("sglang-*-loop.json")
    return json.loads(written.read_text())


@pytest.mark.parametrize("variant", ["radix_cache", "eagle_topk1"])
@pytest.mark.engine_run
def test_a_fresh_run_of_a_variant_has_the_committed_rows(variant: str, tmp_path: Path) -> None:
    """Two variants whose races have harness sides (the model worker's forward, the EAGLE
    target's), against the committed 0.5.23 report."""
    try:
        installed = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    if installed != "0.5.23":
        pytest.skip(f"sglang {installed} installed; the committed report is of 0.5.23")
    committed = json.loads(COMMITTED["0.5.23"].read_text())
    fresh = _fresh(tmp_path, "--variant", variant, "-j", "1")
    assert row_compare.keyed_rows(committed, {variant})
    assert row_compare.differences(committed, fresh, {variant}) == []


@pytest.mark.slow
@pytest.mark.parametrize("version", sorted(COMMITTED))
@pytest.mark.engine_run
def test_a_fresh_run_has_every_committed_row(version: str, tmp_path: Path) -> None:
    """The whole report of a release (several CPU minutes each): every row of the committed
    report's variants is what a fresh run writes. Variants added to the default set since the
    report was written add their own rows (reported, not compared: the report is regenerated
    to hold them), and may change no committed row."""
    try:
        tree = releases.release_tree(version)
    except releases.ReleaseUnavailable as exc:
        pytest.skip(str(exc))
    committed = json.loads(COMMITTED[version].read_text())
    fresh = _fresh(tmp_path, "--sglang-src", str(tree), "-j", "2")
    assert set(committed["variants"]) <= set(fresh["variants"])
    assert row_compare.differences(committed, fresh, set(committed["variants"])) == []
