"""Model Runner V2's mixed prefill+decode warmup (``mrv2_warmup.py``): run as a release has it,
its steps back to back with their outputs discarded. The installed vLLM's own warmup (0.32.0,
the function 0.33.0 still ships) rewrites a UVA ring slot under the write kernel of the first
call's step when called twice in a row, and is race-free called once. On the 0.34.0 wheel's
tree (slow: the wheels), the historical entry: 0.33.0's warmup races (the ring's WAR and the
discarded output's reuse), 0.34.0's (``_run_step``: a synchronize after each step) does not;
on a tree without what 0.34.0's warmup.py imports, the entry is not applicable and says why.
Every verdict is the detector's; the lines are found by their text in the files run."""

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

from overlap_harness.engines.vllm import historical, mrv2_warmup, releases

ROOT = Path(__file__).resolve().parents[3]
REF = "mrv2-warmup (0.34.0)"
KERNEL_LAUNCH = "_apply_write_kernel["  # StagedWriteTensor.apply_write: the kernel reads the slot
HOST_WRITES = {"dst[:n] = x",  # UvaBufferPool.copy_to_uva's host writes of the slot
               'np.concatenate(chunks, out=buf.np[:n], casting="unsafe")'}


def _text(site: str) -> str:
    file, _, line = site.rpartition(":")
    return Path(file).read_text().splitlines()[int(line) - 1].strip()


def _installed_warmup() -> Path:
    from vllm.v1.worker.gpu import warmup

    return Path(warmup.__file__)


def _ring_sides(races: list) -> set[tuple[str, str]]:
    return {(_text(r.first.source), _text(r.second.source)) for r in races
            if str(r.kind) == "WAR"}


@pytest.mark.engine_run
def test_two_warmups_back_to_back_rewrite_a_ring_slot_the_kernel_still_reads() -> None:
    racy = mrv2_warmup.warmup_steps(_installed_warmup(), calls=2)
    assert racy.ran == [True, True]
    sides = _ring_sides(racy.races)
    assert sides, [str(r) for r in racy.races]
    assert all(KERNEL_LAUNCH in first for first, _ in sides), sides
    assert {second for _, second in sides} <= HOST_WRITES, sides
    once = mrv2_warmup.warmup_steps(_installed_warmup(), calls=1)
    assert once.ran == [True] and once.races == []


def _entry_on(tree: Path, folder: Path) -> dict:
    """The historical entry as the report makes it, in a child that loads ``tree``."""
    script = ("import json, sys; from pathlib import Path; "
              "from overlap_harness.engines.vllm.environment import load; load(sys.argv[1]); "
              "from overlap_harness.engines.vllm import historical; "
              "race = next(r for r in historical.HISTORICAL if r.ref == sys.argv[2]); "
              "print(json.dumps(historical.historical_entry(race, Path(sys.argv[3]))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, str(tree), REF, str(folder)],
                          capture_output=True, text=True, env=env, check=False, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.engine_run
def test_the_warmup_races_before_its_per_step_synchronize_and_not_after(tmp_path: Path) -> None:
    try:
        tree = releases.release_tree("0.34.0")
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    entry = _entry_on(tree, tmp_path)
    pre, post = entry["pre_fix"], entry["post_fix"]
    assert pre["source"] == f"vllm==0.33.0:{mrv2_warmup.WARMUP_FILE}"
    assert post["source"] == f"vllm==0.34.0:{mrv2_warmup.WARMUP_FILE}"
    assert pre["races"] > 0 and post["races"] == 0 and post["lines"] == []
    kinds = {line["kind"] for line in pre["lines"]}
    assert kinds == {"WAR", "reuse"}, pre["lines"]
    for line in pre["lines"]:
        first = tree / line["first"].split(":", 1)[1]  # installed:vllm/...:N, the tree's file
        if line["kind"] == "WAR":
            assert KERNEL_LAUNCH in _text(str(first))
            assert _text(str(tree / line["second"].split(":", 1)[1])) in HOST_WRITES
        else:  # the discarded output's D2H, against the stand-in sampler's allocation
            assert "non_blocking=True" in _text(str(first))
            assert line["second"].startswith("overlap_harness/")


def test_a_tree_without_what_the_fixed_warmup_imports_cannot_run_the_entry() -> None:
    race = next(r for r in historical.HISTORICAL if r.ref == REF)
    reason = race.not_applicable()
    if reason is None:
        pytest.skip("the loaded tree has what 0.34.0's warmup.py imports")
    assert "vllm.v1.worker.extensible_kv_cache" in reason
