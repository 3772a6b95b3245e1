"""The release matrix: every supported SGLang release, its wheel downloaded (cached under the
user's cache folder) and unzipped, driven by ``overlap-harness sglang --sglang-src`` with the
default variants. Slow: ``pytest -m slow``; the releases marked ``release_ci`` also run in CI
(.ci/run selects them). A release that cannot be fetched skips with the reason; one that
fails to drive fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from overlap_harness.engines.sglang import releases

#: run by CI beside the default tests (the oldest release whose tree CI can afford twice
#: is not the point: one mid-range release and the newest)
CI_RELEASES = ("0.5.20", "0.5.23")
MIN_VARIANTS = 10


def _marks(version: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.slow] + ([pytest.mark.release_ci] if version in CI_RELEASES else [])


@pytest.mark.parametrize("version", [pytest.param(v, marks=_marks(v), id=v)
                                     for v in releases.SUPPORTED])
def test_release_drives_race_free(version: str, tmp_path: Path) -> None:
    try:
        tree = releases.release_tree(version)
    except releases.ReleaseUnavailable as exc:
        pytest.skip(str(exc))
    out = tmp_path / "loop.json"
    done = subprocess.run([sys.executable, "-m", "overlap_harness", "sglang", "--sglang-src",
                           str(tree), "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["sglang_version"] == version
    assert document["races"] == []
    assert len(document["variants"]) >= MIN_VARIANTS, document.get("not_applicable")
    for entry in document.get("not_applicable", []):
        assert entry["variant"] not in document["variants"]
        assert entry["reason"].strip(), entry


@pytest.mark.slow
def test_the_releases_page_is_what_the_tool_writes(tmp_path: Path) -> None:
    """docs/sglang-releases.md is generated: regenerated from the releases' trees and the
    committed loop reports, it comes out the same."""
    root = Path(__file__).resolve().parents[2]
    page = tmp_path / "page.md"
    done = subprocess.run([sys.executable, str(root / "tools" / "sglang_releases_page.py"),
                           "--out", str(page)], capture_output=True, text=True, timeout=900)
    if done.returncode == 2:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    assert page.read_text() == (root / "docs" / "sglang-releases.md").read_text()
