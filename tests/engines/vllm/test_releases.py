"""releases.release_tree and historical.release_wheel: a wheel in the cache unzipped into a
tree whole (its compiled extensions left out), also when several processes ask for it at once
(CI's two pytest workers run the newest release's tests side by side on a cold cache), and a
wheel that cannot be had named with pip's reason. A small wheel of our own stands in for
vLLM's: nothing is downloaded."""

from __future__ import annotations

import multiprocessing
import zipfile
from pathlib import Path

import pytest

from overlap_harness.engines.vllm import historical, releases
from overlap_harness.engines.vllm.environment import VllmUnavailable

#: a package of many small modules (vLLM's has some 4000 files), so that unzipping takes
#: long enough for processes to overlap
MEMBERS = {"vllm/__init__.py": "__version__ = '9.9.9'\n",
           **{f"vllm/part{i // 50}/module{i}.py": f"INDEX = {i}\n" for i in range(3000)},
           "vllm/_C.abi3.so": "compiled\n",
           "vllm/libcuda_stub.so.1": "compiled\n",
           "vllm-9.9.9.dist-info/METADATA": "Name: vllm\nVersion: 9.9.9\n"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A wheel cache holding only vllm 9.9.9's (fake) wheel."""
    cache = tmp_path / "wheels"
    cache.mkdir()
    with zipfile.ZipFile(cache / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl", "w") as wheel:
        for name, text in MEMBERS.items():
            wheel.writestr(name, text)
    monkeypatch.setenv(historical.WHEEL_CACHE_ENV, str(cache))
    return cache


def _unzipped(tree: Path) -> dict[str, str]:
    return {str(path.relative_to(tree)): path.read_text()
            for path in sorted(tree.rglob("*")) if path.is_file()}


def _tree_of(_: int) -> str:
    return str(releases.release_tree("9.9.9"))


def test_a_cached_wheel_is_unzipped_whole_without_its_extensions(cache: Path) -> None:
    tree = releases.release_tree("9.9.9")
    assert tree == cache / "trees" / "vllm-9.9.9"
    assert _unzipped(tree) == {name: text for name, text in MEMBERS.items()
                               if ".so" not in name}
    assert sorted(p.name for p in tree.parent.iterdir()) == ["vllm-9.9.9"]  # no partial left
    assert releases.release_tree("9.9.9") == tree  # the second time, the same tree


def test_processes_asking_at_once_all_get_the_one_whole_tree(cache: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        trees = pool.map(_tree_of, range(8))
    assert set(trees) == {str(cache / "trees" / "vllm-9.9.9")}
    assert _unzipped(Path(trees[0])) == {name: text for name, text in MEMBERS.items()
                                         if ".so" not in name}
    assert sorted(p.name for p in (cache / "trees").iterdir()) == ["vllm-9.9.9"]


def test_a_wheel_that_cannot_be_had_is_named_with_pips_reason(
        cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No index and no local wheels: pip fails, the error names the release and pip's last
    line, and nothing is left in the cache but the one wheel that was there."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels-here"))
    with pytest.raises(VllmUnavailable, match=r"^vllm==9\.9\.8: cannot download \(.+\)$"):
        releases.release_tree("9.9.8")
    assert [p.name for p in cache.iterdir()] == ["vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"]
