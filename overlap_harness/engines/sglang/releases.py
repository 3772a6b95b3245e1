"""SGLang's released trees, as its users have them: a release's wheel, downloaded once and
unzipped into the user's cache folder, so that ``--sglang-src`` (and the release-matrix
tests) can drive any published release without installing it.

The wheel is fetched with ``pip download --no-deps sglang==VERSION`` (the wheel carries the
whole Python tree; its dependencies are not needed to read or drive it: the adapter imports
it beside the installed environment). Unzipped once; later calls reuse the folder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

#: the releases the adapter is held to (issue 32: 0.5.17 through 0.5.23)
SUPPORTED = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")

_VERSION = re.compile(r"^\d+(\.\d+){1,3}([a-z]+\d+)?(\.post\d+)?$")


class ReleaseUnavailable(RuntimeError):
    """A release could not be fetched (no network, no such version, a broken wheel); the
    message says which and why."""


def cache_root() -> Path:
    """Where releases are kept: ``$OVERLAP_HARNESS_SGLANG_RELEASES``, else
    ``$XDG_CACHE_HOME/overlap-harness/sglang`` (``~/.cache`` by default)."""
    if explicit := os.environ.get("OVERLAP_HARNESS_SGLANG_RELEASES"):
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "overlap-harness" / "sglang"


def release_tree(version: str, *, timeout_s: float = 600.0) -> Path:
    """The unzipped tree of SGLang ``version`` (the folder holding ``sglang/``), downloaded
    and unzipped into :func:`cache_root` on first use. Raises :class:`ReleaseUnavailable`
    with pip's reason when the wheel cannot be had, ``ValueError`` for a malformed version."""
    if not _VERSION.match(version):
        raise ValueError(f"not a release version: {version!r} (expected e.g. '0.5.20')")
    tree = cache_root() / version
    if (tree / "sglang" / "__init__.py").is_file():
        return tree
    wheels = cache_root() / "wheels"
    wheel = _find_wheel(wheels, version) or _download(wheels, version, timeout_s)
    partial = tree.with_name(f"{version}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
    except zipfile.BadZipFile as exc:
        wheel.unlink(missing_ok=True)
        raise ReleaseUnavailable(f"sglang=={version}: broken wheel {wheel.name} ({exc}); "
                                 "removed, fetch again") from exc
    if not (partial / "sglang" / "__init__.py").is_file():
        raise ReleaseUnavailable(f"sglang=={version}: {wheel.name} holds no sglang package")
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)  # whole or not at all: an interrupted unzip is never reused
    return tree


def _find_wheel(folder: Path, version: str) -> Path | None:
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def _download(folder: Path, version: str, timeout_s: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "-q", "-d", str(folder), f"sglang=={version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ReleaseUnavailable(f"sglang=={version}: pip download took over "
                                 f"{timeout_s:.0f} s") from exc
    wheel = _find_wheel(folder, version)
    if done.returncode != 0 or wheel is None:
        lines = [line for line in (done.stderr or done.stdout).splitlines()
                 if line.strip() and not line.startswith("WARNING")]
        reason = lines[-1] if lines else f"pip exited {done.returncode}"
        raise ReleaseUnavailable(f"sglang=={version}: cannot download ({reason})")
    return wheel
