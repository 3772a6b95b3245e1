"""Every ``overlap_harness.`` name the README writes in backticks imports as written."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PROSE = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)  # inline code only
NAMES = sorted({m for code in re.findall(r"`([^`]+)`", PROSE)
                for m in re.findall(r"\boverlap_harness(?:\.\w+)+", code)})


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_readme_names_some() -> None:
    assert "overlap_harness.recorder.check_script" in NAMES


@pytest.mark.parametrize("dotted", NAMES)
def test_readme_name_imports_as_written(dotted: str) -> None:
    assert resolve(dotted) is not None


def test_a_name_that_is_not_there_fails() -> None:
    with pytest.raises(AttributeError):
        resolve("overlap_harness.recorder.no_such_function")


def test_no_bare_package_folder_names() -> None:
    """``recorder.x`` is a folder of the repository, not an importable name once installed
    (it installs as ``overlap_harness.recorder``)."""
    folders = ("model", "sim", "gpu_check", "recorder", "reports", "scenarios")
    bare = [code for code in re.findall(r"`([^`]+)`", PROSE)
            if re.match(rf"@?(?:{'|'.join(folders)})\.\w+\(", code)]
    assert bare == []
