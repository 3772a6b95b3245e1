"""An engine command's ``--out`` reports (Perfetto trace, SARIF) name files as its text and
JSON do (overlap_harness/engines/core/variant_reports.py): the tree's files from the tree's
root, the harness's from its checkout, never absolutely; the SARIF's ``%SRCROOT%`` is the
tree's root. Checked on a small racy program of its own, in a tree outside the working
directory (so the recorder itself names its file absolutely); the race is the recorder's.
Without a root set (``overlap-harness check``'s way) the same run keeps the recorder's names.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from overlap_harness.engines.core.results import name_files_relative_to
from overlap_harness.engines.core.variant_reports import write_watch_reports
from overlap_harness.reports.sarif import HARNESS, SRCROOT

PROGRAM = textwrap.dedent("""\
    import torch


    def step(side):
        data = torch.zeros(4, device="cuda")
        with torch.cuda.stream(side):
            data.add_(1)
        for _ in range(2):
            total = data.sum()  # not ordered after the side stream's write
        return total
    """)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path/tree/pkg/prog.py`` imported; the working directory elsewhere."""
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "prog.py").write_text(PROGRAM)
    spec = importlib.util.spec_from_file_location("shown_reports_prog", root / "pkg" / "prog.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["shown_reports_prog"] = module
    spec.loader.exec_module(module)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    yield root
    sys.modules.pop("shown_reports_prog", None)
    name_files_relative_to(None)


def _reports(root: Path | None, out: Path) -> tuple[str, str]:
    import torch

    import overlap_harness.recorder as recorder

    name_files_relative_to(root)
    with recorder.watch(mode="cpu") as watch:
        sys.modules["shown_reports_prog"].step(torch.cuda.Stream())
        torch.cuda.synchronize()
    assert watch.races, "the program's race"
    write_watch_reports("prog", watch, out)
    return (out / "trace.json").read_text(), (out / "results.sarif").read_text()


def test_the_reports_name_the_trees_files_from_its_root(tree: Path, tmp_path: Path) -> None:
    trace, sarif = _reports(tree, tmp_path / "out")
    shown = f"pkg{os.sep}prog.py:"
    for name, text in (("trace", trace), ("sarif", sarif)):
        assert str(tree) not in text, name
        assert shown in text, name
    log = json.loads(sarif)["runs"][0]
    locations = [location["physicalLocation"]["artifactLocation"]
                 for result in log["results"]
                 for location in result["locations"] + result["relatedLocations"]]
    assert locations and {"uri": "pkg/prog.py", "uriBaseId": SRCROOT} in locations
    assert all(location["uriBaseId"] in (SRCROOT, HARNESS) for location in locations)
    assert all(not location["uri"].startswith(("/", "..")) for location in locations)


def test_without_a_root_the_recorders_names_stay(tree: Path, tmp_path: Path) -> None:
    trace, sarif = _reports(None, tmp_path / "out")
    assert f"{tree}{os.sep}pkg{os.sep}prog.py:" in trace  # outside the working directory
    uris = {location["physicalLocation"]["artifactLocation"]["uri"]
            for result in json.loads(sarif)["runs"][0]["results"]
            for location in result["locations"]}
    assert uris == {"../tree/pkg/prog.py"}  # from %SRCROOT%, the working directory
