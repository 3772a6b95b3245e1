"""``overlap-harness vllm`` where its input is bad: a tree that is not vLLM's, a vLLM that does
not import, an unknown variant, a bad -j: one line, exit 2, no traceback. Runs without vLLM
(the import is stood in for where a run would need it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from overlap_harness.cli import main
from overlap_harness.engines.vllm import environment


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_folder_without_vllm_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["vllm", "--vllm-src", str(tmp_path)]) == 2
    assert _err(capsys) == (f"overlap-harness vllm: --vllm-src {tmp_path}: holds no vllm "
                            "package (no vllm/__init__.py)\n")


def test_a_missing_folder_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["vllm", "--vllm-src", str(tmp_path / "nope")]) == 2
    assert _err(capsys) == f"overlap-harness vllm: --vllm-src {tmp_path / 'nope'}: not a folder\n"


def test_a_vllm_that_does_not_import_is_one_line_with_the_import_error(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('broken on purpose\\nsecond line')\n")
    monkeypatch.setattr(environment, "_IMPORTED", [])
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["vllm", "--vllm-src", str(tmp_path)]) == 2
    err = _err(capsys)
    assert err.startswith("overlap-harness vllm: cannot import vllm.")
    assert "ImportError: broken on purpose second line" in err


def test_the_tree_is_the_package_folder_or_its_parent(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert environment.tree_root(str(tmp_path)) == tmp_path.resolve()
    assert environment.tree_root(str(package)) == tmp_path.resolve()
    assert environment.tree_root(None) is None


def test_a_bad_job_count_is_refused_as_it_is_parsed(capsys) -> None:
    assert main(["vllm", "-j", "0"]) == 2
    assert _err(capsys) == ("overlap-harness vllm: error: argument -j/--jobs: expected a whole "
                            "number of at least 1, got 0 (see overlap-harness vllm --help)\n")
