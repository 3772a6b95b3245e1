"""Every relative link of README.md and docs/*.md resolves inside the repository, anchors
included, and every `name.md` a page writes in backticks is a file of the repository: a fresh
clone has nothing beside it (the specification's pages live outside the repository, so the
pages name them in words, never as a file to open)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: code marks and punctuation dropped, lower case, spaces
    as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (a repeated one gets ``-1``, ``-2``, ... as on
    GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", text), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def link_targets(text: str) -> list[str]:
    """Inline and reference link targets, outside code."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each link of ``page`` that does not resolve inside ``root``, with the reason."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for target in link_targets(text):
        if not target or SCHEME.match(target):
            continue  # http(s), mailto: not ours to check here
        path_part, _, anchor = target.partition("#")
        where = page if not path_part else (page.parent / path_part).resolve()
        if not where.is_relative_to(root.resolve()):
            problems.append(f"{target}: outside the repository")
        elif not where.exists():
            problems.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(
                where.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading with anchor #{anchor}")
    return problems


def missing_named_pages(page: Path, root: Path = ROOT) -> list[str]:
    """Each page named in backticks (outside fenced code) as a path (``docs/x.md``,
    ``../x.md``) or in capitals (``SPEC.md``) that is not a file of ``root``, relative to the
    page or to the repository root. A lowercase bare name (``summary.md``) is a file some
    command writes, not a page of the repository."""
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    named = [code.strip() for _, code in CODE_SPAN.findall(prose)]
    return [name for name in named if re.fullmatch(r"[\w./-]+\.md", name)
            and ("/" in name or name[0].isupper())
            and not any((base / name).resolve().is_file()
                        and (base / name).resolve().is_relative_to(root.resolve())
                        for base in (page.parent, root))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_named_in_backticks_is_in_the_repository(page: Path) -> None:
    assert missing_named_pages(page) == []


def test_the_readme_links_its_docs() -> None:
    targets = link_targets((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {"docs/setup.md", "docs/check.md", "docs/commands.md"} <= set(targets)


def test_the_checks_find_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# A title: with `code`\n\n## Twice\n## Twice\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/there.md) [ok](docs/there.md#a-title-with-code) [ok](docs/there.md#twice-1)\n"
        "[web](https://example.com/x.md) [self](#intro) [ref]\n\n# Intro\n\n"
        "[gone](docs/missing.md) [out](../elsewhere.md) [anchor](docs/there.md#nope)\n"
        "[selfnope](#nowhere)\n\n[ref]: docs/nothing.md\n\n"
        "`docs/there.md` `there.md` `summary.md` `SPEC.md` `../shared/SPEC.md` `docs/no.md`\n"
        "```\n[in code](not/checked.md) `NOT.md`\n```\n")
    assert broken_links(page, tmp_path) == [
        "docs/missing.md: no such file", "../elsewhere.md: outside the repository",
        "docs/there.md#nope: no heading with anchor #nope", "#nowhere: no heading with anchor "
        "#nowhere", "docs/nothing.md: no such file"]
    assert missing_named_pages(page, tmp_path) == ["SPEC.md", "../shared/SPEC.md", "docs/no.md"]
