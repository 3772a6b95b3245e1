"""Model Runner V2's kernel warmup (``kernel_warmup.py``): ``_warmup_kernels`` as the tree has
it runs its prefill, decode and cleanup steps back to back with their outputs discarded, and
every step's ``BlockTables.apply_staged_writes`` rewrites a slot of the ``num_blocks`` UVA ring
that the gather kernel of two steps before still reads (WAR); with a host wait after each step
(the harness's proposed fix, the file's own lines kept) it is race-free. On the installed vLLM
and, slow, on the 0.34.0 wheel's tree (the newest, whose mixed warmup got that wait and whose
kernel warmup did not). Every verdict is the detector's; the lines are found by their text in
the files run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from overlap_harness.engines.vllm import kernel_warmup, releases

ROOT = Path(__file__).resolve().parents[3]
GATHER_LAUNCH = "_gather_block_tables_kernel["  # BlockTables.gather_block_tables
HOST_WRITE = "dst[:n] = x"  # UvaBufferPool.copy_to_uva, through UvaBackedTensor.copy_to_uva


def _text(site: str) -> str:
    file, _, line = site.rpartition(":")
    return Path(file).read_text().splitlines()[int(line) - 1].strip()


def _installed_warmup() -> Path:
    from vllm.v1.worker.gpu import warmup

    return Path(warmup.__file__)


def test_the_declared_gather_copies_each_requests_blocks_and_zeroes_the_padding() -> None:
    """The declared kernel's values, against the block ids appended (not its own code)."""
    import torch
    from vllm.v1.worker.gpu import block_table, buffer_utils

    from overlap_harness.engines.vllm.environment import cuda_selected
    from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
    from overlap_harness.recorder import watch

    with watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils):
        worker = kernel_warmup.BlockTableWorker(torch.device("cuda"))
        tables = worker.tables
        tables.append_block_ids(2, ([7, 8, 9],), overwrite=True)
        tables.append_block_ids(3, ([4],), overwrite=True)
        tables.append_block_ids(3, ([5],), overwrite=False)
        tables.apply_staged_writes()
        with kernel_warmup.gather_kernel_declared(block_table, tables):
            (gathered,) = tables.gather_block_tables(worker.request_rows[2:4], 3)
        rows = gathered.cpu().tolist()
    assert [row[:3] for row in rows] == [[7, 8, 9], [4, 5, 0], [0, 0, 0]]
    assert w.races == []


@pytest.mark.engine_run
def test_the_kernel_warmup_rewrites_a_ring_slot_its_gather_kernel_still_reads() -> None:
    racy = kernel_warmup.kernel_warmup_steps()
    assert racy.steps == 5  # the prefill, 3 decode steps, the cleanup
    war = [r for r in racy.races if str(r.kind) == "WAR"]
    assert war, [str(r) for r in racy.races]
    for race in war:
        assert GATHER_LAUNCH in _text(race.first.source), race
        assert _text(race.second.source) == HOST_WRITE, race
        assert race.second.iteration >= race.first.iteration + 2  # the ring of 2 came back
    # the rest: the discarded AsyncOutput's D2H against the stand-in sampler's next allocation
    for race in racy.races:
        if race not in war:
            assert str(race.kind) == "reuse" and "non_blocking=True" in _text(race.first.source)
            assert "overlap_harness" in race.second.source


@pytest.mark.engine_run
def test_with_a_wait_after_each_step_the_kernel_warmup_is_race_free(tmp_path: Path) -> None:
    original = _installed_warmup()
    fixed = kernel_warmup.with_step_waits(original, tmp_path / "warmup.py")
    before, after = original.read_text().splitlines(), fixed.read_text().splitlines()
    assert len(before) == len(after)
    changed = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert len(changed) == 2  # the prefill's sampling and the decode step's
    assert all(a == b + "; torch.accelerator.synchronize()" for b, a in changed)
    twin = kernel_warmup.kernel_warmup_steps(fixed)
    assert twin.steps == 5 and twin.races == []


def test_a_file_whose_kernel_warmup_ends_no_step_as_expected_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "warmup.py"
    source.write_text("def _warmup_kernels(runner, execute, sample):\n    execute(None)\n")
    with pytest.raises(ValueError, match="has none of"):
        kernel_warmup.with_step_waits(source, tmp_path / "fixed.py")


@pytest.mark.slow
@pytest.mark.engine_run
def test_on_the_0_34_tree_the_kernel_warmup_races_and_its_twin_does_not(
        tmp_path: Path) -> None:
    try:
        tree = releases.release_tree("0.34.0")
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    script = (
        "import json, sys; from pathlib import Path; "
        "from overlap_harness.engines.vllm.environment import load; load(sys.argv[1]); "
        "from overlap_harness.engines.vllm import kernel_warmup; "
        "from vllm.v1.worker.gpu import warmup; "
        "racy = kernel_warmup.kernel_warmup_steps(); "
        "fixed = kernel_warmup.with_step_waits(Path(warmup.__file__), Path(sys.argv[2])); "
        "twin = kernel_warmup.kernel_warmup_steps(fixed); "
        "print(json.dumps({'file': warmup.__file__, 'steps': [racy.steps, twin.steps], "
        "'twin': len(twin.races), 'war': [[r.first.source, r.second.source, "
        "r.first.iteration, r.second.iteration] for r in racy.races "
        "if str(r.kind) == 'WAR']}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, str(tree),
                           str(tmp_path / "warmup.py")], capture_output=True, text=True,
                          env=env, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(found["file"]).resolve() == (tree / kernel_warmup.WARMUP_FILE).resolve()
    assert found["steps"] == [5, 5] and found["twin"] == 0
    assert found["war"]
    for first, second, first_step, second_step in found["war"]:
        assert Path(first).is_relative_to(tree) and Path(second).is_relative_to(tree)
        assert GATHER_LAUNCH in _text(first) and _text(second) == HOST_WRITE
        assert second_step >= first_step + 2
