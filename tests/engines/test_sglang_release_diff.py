"""The release comparison of the overlap path's syncs, on small trees written here: each
expected change is written by hand from the two sources, never computed by the code."""

from __future__ import annotations

import textwrap
import zipfile
from pathlib import Path

import pytest

from overlap_harness.engines.sglang import releases
from overlap_harness.engines.sglang.report.release_diff import (
    compare,
    markdown,
    necessity_changes,
    tree_sites,
)

_MODULES = ("sglang.srt.managers.scheduler", "sglang.srt.managers.overlap_utils")


def _tree(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    (root / "sglang").mkdir(exist_ok=True)
    return root


_RUN_BATCH = """
    class Scheduler:
        def run_batch(self, batch):
            self.forward_stream.wait_stream(self.schedule_stream)
            return batch
"""


def test_a_moved_sync_is_no_change_and_an_added_one_is(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", {"sglang/srt/managers/scheduler.py": _RUN_BATCH})
    # the same wait two lines further down, and a new wait_event in a new function
    new = _tree(tmp_path / "new", {"sglang/srt/managers/scheduler.py": """

        class Scheduler:
            def run_batch(self, batch):
                self.forward_stream.wait_stream(self.schedule_stream)
                return batch

            def publish(self):
                self.copy_stream.wait_event(self.done)
    """})
    change = compare(tree_sites(old, _MODULES), tree_sites(new, _MODULES))
    assert change.sites_removed == ()
    assert [(i.function, i.kind, i.code, where) for i, where in change.sites_added] == [
        ("Scheduler.publish", "wait_event", "self.copy_stream.wait_event(self.done)",
         "sglang/srt/managers/scheduler.py:9")]


def test_a_removed_sync_and_a_module_new_to_the_path(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", {"sglang/srt/managers/scheduler.py": _RUN_BATCH})
    new = _tree(tmp_path / "new", {
        "sglang/srt/managers/scheduler.py": """
            class Scheduler:
                def run_batch(self, batch):
                    return batch
        """,
        "sglang/srt/managers/overlap_utils.py": """
            def publish(ready):
                ready.record()
        """})
    change = compare(tree_sites(old, _MODULES), tree_sites(new, _MODULES))
    assert change.modules_added == ("sglang.srt.managers.overlap_utils",)
    assert change.sites_added == ()  # the new module's sites are reported as the module
    assert [(i.function, where) for i, where in change.sites_removed] == [
        ("Scheduler.run_batch", "sglang/srt/managers/scheduler.py:4")]
    text = markdown(["1.0", "1.1"], [change])
    assert "### 1.0 → 1.1" in text
    assert "removed `self.forward_stream.wait_stream(self.schedule_stream)`" in text


def test_a_second_identical_wait_counts_once(tmp_path: Path) -> None:
    old = _tree(tmp_path / "old", {"sglang/srt/managers/scheduler.py": _RUN_BATCH})
    new = _tree(tmp_path / "new", {"sglang/srt/managers/scheduler.py": """
        class Scheduler:
            def run_batch(self, batch):
                self.forward_stream.wait_stream(self.schedule_stream)
                self.forward_stream.wait_stream(self.schedule_stream)
                return batch
    """})
    change = compare(tree_sites(old, _MODULES), tree_sites(new, _MODULES))
    assert [where for _, where in change.sites_added] == [
        "sglang/srt/managers/scheduler.py:5"]


def test_a_folder_without_sglang_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no sglang/ folder"):
        tree_sites(tmp_path)


def test_a_cached_wheel_is_unzipped_once(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERLAP_HARNESS_SGLANG_RELEASES", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    with zipfile.ZipFile(tmp_path / "wheels" / "sglang-9.9.9-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglang/__init__.py", "__version__ = '9.9.9'\n")
    tree = releases.release_tree("9.9.9")
    assert (tree / "sglang" / "__init__.py").read_text() == "__version__ = '9.9.9'\n"
    (tmp_path / "wheels" / "sglang-9.9.9-py3-none-any.whl").unlink()
    assert releases.release_tree("9.9.9") == tree  # no download: the tree is reused


def test_a_broken_wheel_is_said_and_removed(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERLAP_HARNESS_SGLANG_RELEASES", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    bad = tmp_path / "wheels" / "sglang-9.9.8-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(releases.ReleaseUnavailable, match="broken wheel"):
        releases.release_tree("9.9.8")
    assert not bad.exists()
    with pytest.raises(ValueError, match="not a release version"):
        releases.release_tree("latest; rm -rf /")


def test_a_verdict_that_changed_between_releases() -> None:
    def row(variant: str, site: str, code: str, real: str) -> dict:
        return {"variant": variant, "site": site, "function": "Scheduler.run_batch",
                "code": code, "real": real}

    wait = "self.forward_stream.wait_stream(self.schedule_stream)"
    older = [row("a", "scheduler.py:10", wait, "necessary"),
             row("b", "scheduler.py:10", wait, "redundant"),
             row("a", "scheduler.py:20", "ev.record()", "necessary")]
    newer = [row("a", "scheduler.py:14", wait, "redundant"),  # moved and changed
             row("b", "scheduler.py:14", wait, "redundant"),  # moved, same verdict
             row("c", "scheduler.py:30", "ev.wait()", "necessary")]  # only in the newer
    (change,) = necessity_changes(older, newer)
    assert (change.variant, change.older, change.newer) == (
        "a", "necessary at scheduler.py:10", "redundant at scheduler.py:14")
