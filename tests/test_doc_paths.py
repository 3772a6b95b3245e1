"""Every file path README.md and docs/*.md name in code (a `span` or a fenced block) exists in
the repository, and every module they name by its dotted name (`recorder.host_arrays`,
`overlap_harness.engines.core`) is a file of it: a reader who opens what a page names finds
it. (tests/test_doc_links.py checks the links.)

What counts as a path: a name whose first part is a folder or file at the repository's top
(`recorder/core.py`, `tests/recorder/`, `.ci/run`), or that starts with ``../`` and stays
inside it. Other names are not the repository's: SGLang's files (`sglang/srt/...`), files a
command writes into a folder the user names, absolute paths. Patterns are expanded and must
match at least one file: `*`, `{a,b}`, `x.json|md` (either extension), and a placeholder
(`<variant>`, `NAME`) stands for any name. `path:line` and `path::name` name the path;
`module.py`-less `folder/module.attribute` names `folder/module.py`.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = {entry.name for entry in ROOT.iterdir()
       if entry.name not in {".git", ".venv", ".hypothesis", ".ruff_cache"}
       and not entry.name.endswith(".egg-info")}

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# a path-like name: word characters, dots, hyphens, pattern marks, at least one slash
PATH = re.compile(r"(?<![\w./<>{}*$-])((?:\.\.?/)*[\w.<>{}*,|-]*\w[\w.<>{}*,|-]*/[\w./<>{}*,|-]*)")
MODULE = re.compile(r"(?<![\w./-])((?:overlap_harness|recorder|model|sim|gpu_check)"
                    r"(?:\.[A-Za-z_]\w*)+)(?![\w/-])")
PLACEHOLDER = re.compile(r"<[^<>/]*>|\b[A-Z][A-Z_]*[A-Z]\b(?=$|[./-])")
PACKAGE_DIRS = {"overlap_harness": "overlap_harness", "recorder": "recorder", "model": "model",
                "sim": "sim", "gpu_check": "gpu_check", "scenarios": "scenarios",
                "reports": "reports"}  # the last two only as ``overlap_harness.scenarios``


def code_of(text: str) -> list[str]:
    """The text of every fenced block and every code span outside them."""
    blocks = [match.group(2) for match in FENCE.finditer(text)]
    prose = FENCE.sub("", text)
    return blocks + [code for _, code in CODE_SPAN.findall(prose)]


def braces(pattern: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md``; ``a.json|md`` likewise; ``r/gpu|cpu`` ->
    ``r/gpu``, ``r/cpu``."""
    pattern = re.sub(r"\.(\w+)((?:\|\w+)+)$", lambda m: ".{" + m.group(1) + m.group(2)
                     .replace("|", ",") + "}", pattern)
    pattern = re.sub(r"(?<=/)([\w-]+(?:\|[\w-]+)+)$",
                     lambda m: "{" + m.group(1).replace("|", ",") + "}", pattern)
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [expanded for choice in match.group(1).split(",")
            for expanded in braces(pattern[:match.start()] + choice + pattern[match.end():])]


def exists(name: str, base: Path, root: Path) -> bool:
    """``name`` (a pattern: ``*`` and placeholders) names something under ``base``, inside
    ``root``."""
    pattern = PLACEHOLDER.sub("*", name)
    for candidate in (pattern, re.sub(r"\.[A-Za-z_]\w*$", ".py", pattern)):
        matches = glob.glob(str(base / candidate), recursive=False)
        if any(Path(m).resolve().is_relative_to(root.resolve()) for m in matches):
            return True
    return False


def named_paths(text: str, top: set[str]) -> list[str]:
    """The repository paths a page's code names (see the module docstring)."""
    names = []
    for code in code_of(text):
        for token in PATH.findall(code):
            token = re.split(r"::?(?=[\w<])", token)[0].rstrip(".,|")
            first = token.lstrip("./").split("/")[0] if not token.startswith("../") else ".."
            if first in top or token.startswith("../"):
                names.append(token)
    return names


def missing_paths(page: Path, root: Path = ROOT, top: set[str] = TOP) -> list[str]:
    """Each path ``page`` names in code that nothing in ``root`` matches (relative to the
    page for ``../``, else to the root)."""
    missing = []
    for token in named_paths(page.read_text(encoding="utf-8"), top):
        base = page.parent if token.startswith("../") else root
        if token.startswith("../") and not (page.parent / token.split("*")[0].split("<")[0]
                                             ).resolve().is_relative_to(root.resolve()):
            continue  # outside the repository: the specification's pages, named in words
        if not all(exists(choice, base, root) for choice in braces(token)):
            missing.append(token)
    return missing


def module_file(name: str, root: Path = ROOT) -> bool:
    """``recorder.host_arrays`` (``.attribute`` after it allowed): a module of the repository,
    or a name its package's ``__init__.py`` defines or imports (``recorder.watch``)."""
    parts = name.split(".")
    folder = root / PACKAGE_DIRS[parts[0]]
    if parts[0] == "overlap_harness" and len(parts) > 1 and parts[1] in PACKAGE_DIRS:
        folder, parts = root / PACKAGE_DIRS[parts[1]], parts[1:]
    for part in parts[1:]:
        if (folder / f"{part}.py").is_file():
            return True  # the rest are attributes of the module
        if not (folder / part / "__init__.py").is_file():
            init = folder / "__init__.py"
            return init.is_file() and re.search(rf"\b{part}\b", init.read_text()) is not None
        folder = folder / part
    return True


def missing_modules(page: Path, root: Path = ROOT) -> list[str]:
    """Each dotted module name of the repository that ``page`` names in code and that is no
    file of ``root``."""
    return [name for code in code_of(page.read_text(encoding="utf-8"))
            for name in MODULE.findall(code) if not module_file(name, root)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    assert missing_paths(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_a_page_names_is_a_file(page: Path) -> None:
    assert missing_modules(page) == []


def test_the_checks_find_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "recorder").mkdir()
    (tmp_path / "recorder" / "__init__.py").write_text("from recorder.core import exported\n")
    (tmp_path / "recorder" / "core.py").write_text("")
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "a-0.5.23-loop.json").write_text("")
    (tmp_path / "reports" / "a-0.5.23-loop.md").write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "`recorder/core.py` `recorder/core.py:12` `recorder/core.Recording` `recorder/`\n"
        "`reports/a-<version>-loop.{json,md}` `reports/a-*-loop.json|md` `sglang/srt/x.py`\n"
        "`../recorder/core.py` `recorder.core.Recording` `recorder.gone` `recorder.exported`\n"
        "`reports/a-0.5.23-loop.json|md`\n"
        "```\noverlap-harness check --out reports/NAME.json recorder/missing.py\n```\n"
        "`recorder/gone.py` `reports/a-{0.5.23,0.5.24}-loop.md` `reports/b-*.md`\n"
        "`../recorder/nope.py` `../../elsewhere/SPEC.md`\n")
    top = {"recorder", "reports", "docs"}
    assert missing_paths(page, tmp_path, top) == [
        "recorder/missing.py", "recorder/gone.py", "reports/a-{0.5.23,0.5.24}-loop.md",
        "reports/b-*.md", "../recorder/nope.py"]
    assert missing_modules(page, tmp_path) == ["recorder.gone"]
    assert braces("r/gpu|cpu") == ["r/gpu", "r/cpu"]
    assert braces("r/a-*.json|md") == ["r/a-*.json", "r/a-*.md"]
