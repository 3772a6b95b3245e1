"""What changed in the overlap path's syncs between two SGLang trees, read from the source.

The sync-site scan (:func:`~overlap_harness.engines.core.helper_sites.scan_files`) runs over
the path's files of each tree without importing either (a file is found from its module name);
a site is matched across trees by what it is, not where: its module, its function, its kind
and its statement's text (whitespace collapsed), counted, so that a release that only moved
code reports nothing and one that adds a second identical wait in a function reports one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from overlap_harness.engines.core.helper_sites import scan_files
from overlap_harness.engines.core.necessity import MUTABLE_KINDS
from overlap_harness.engines.sglang.report.path_sites import PATH_MODULES


@dataclass(frozen=True, slots=True, order=True)
class SiteIdentity:
    """A sync site as matched across trees: module, function, kind, statement text."""

    module: str
    function: str
    kind: str
    code: str


@dataclass(frozen=True, slots=True)
class TreeSites:
    """One tree's path: the modules it has, and its sites with their ``file:line`` there."""

    modules: frozenset[str]
    sites: dict[SiteIdentity, list[str]]  # identity -> ["sglang/srt/...:line", ...]


@dataclass(frozen=True, slots=True)
class SyncChanges:
    """From an older tree to a newer one: modules and sites that appeared or went away."""

    modules_added: tuple[str, ...]
    modules_removed: tuple[str, ...]
    sites_added: tuple[tuple[SiteIdentity, str], ...]  # identity, where in the newer tree
    sites_removed: tuple[tuple[SiteIdentity, str], ...]  # identity, where in the older tree


def module_file(tree: Path, module: str) -> Path | None:
    """The source file of ``module`` in ``tree`` (the folder holding ``sglang/``), if any."""
    base = tree.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def tree_sites(tree: Path, modules: tuple[str, ...] = PATH_MODULES) -> TreeSites:
    """The path's sync sites of ``tree`` (``tree/sglang`` must exist)."""
    if not (tree / "sglang").is_dir():
        raise FileNotFoundError(f"{tree}: no sglang/ folder (give the folder that holds it)")
    files = {module: path for module in modules if (path := module_file(tree, module))}
    by_file = {str(path.resolve()): module for module, path in files.items()}
    sites: dict[SiteIdentity, list[str]] = {}
    for site in scan_files(list(by_file), MUTABLE_KINDS):
        module = by_file[site.file]
        identity = SiteIdentity(module, site.function, str(site.kind),
                                " ".join(site.code.split()))
        relative = Path(site.file).resolve().relative_to(tree.resolve()).as_posix()
        sites.setdefault(identity, []).append(f"{relative}:{site.line}")
    return TreeSites(frozenset(files), sites)


def compare(older: TreeSites, newer: TreeSites) -> SyncChanges:
    """The changes from ``older`` to ``newer``; a site whose module is absent from either
    tree is reported with its module, not as a site change."""
    common = older.modules & newer.modules
    added: list[tuple[SiteIdentity, str]] = []
    removed: list[tuple[SiteIdentity, str]] = []
    for identity in sorted(set(older.sites) | set(newer.sites)):
        if identity.module not in common:
            continue
        before = older.sites.get(identity, [])
        after = newer.sites.get(identity, [])
        if len(after) > len(before):
            added += [(identity, where) for where in after[len(before):]]
        elif len(before) > len(after):
            removed += [(identity, where) for where in before[len(after):]]
    return SyncChanges(tuple(sorted(newer.modules - older.modules)),
                       tuple(sorted(older.modules - newer.modules)),
                       tuple(added), tuple(removed))


def markdown(versions: list[str], changes: list[SyncChanges]) -> str:
    """One section per consecutive pair of ``versions`` (``changes[i]``: versions[i] to
    versions[i+1])."""
    lines: list[str] = []
    for (old, new), change in zip(pairwise(versions), changes, strict=True):
        lines.append(f"### {old} → {new}")
        lines.append("")
        if not any((change.modules_added, change.modules_removed, change.sites_added,
                    change.sites_removed)):
            lines += ["No sync of the overlap path added, removed or changed.", ""]
            continue
        for module in change.modules_added:
            lines.append(f"- module added to the path: `{module}`")
        for module in change.modules_removed:
            lines.append(f"- module gone from the path: `{module}`")
        for identity, where in change.sites_added:
            lines.append(f"- added `{identity.code}` ({identity.kind}) in "
                         f"`{identity.function}`, {where}")
        for identity, where in change.sites_removed:
            lines.append(f"- removed `{identity.code}` ({identity.kind}) from "
                         f"`{identity.function}`, was {where}")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class VerdictChange:
    """A site whose necessity verdict differs between two releases' loop reports, in one
    variant that both ran."""

    variant: str
    function: str
    code: str
    older: str  # verdict and site in the older release: "necessary at sglang/...:123"
    newer: str


def necessity_changes(older_rows: list[dict], newer_rows: list[dict]) -> list[VerdictChange]:
    """Rows of two loop reports (``reports/conformance/sglang-V-loop.json``'s ``rows``)
    matched by variant, function and statement text, whose ``real`` verdict differs. A row
    only one release has (a site added or removed, a variant one of them cannot run) is the
    sync comparison's business, not a verdict change."""

    def keyed(rows: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
        table: dict[tuple[str, str, str], list[dict]] = {}
        for row in rows:
            key = (row["variant"], row["function"], " ".join(row["code"].split()))
            table.setdefault(key, []).append(row)
        return table

    older, newer = keyed(older_rows), keyed(newer_rows)
    changes = []
    for key in sorted(set(older) & set(newer)):
        for before, after in zip(older[key], newer[key], strict=False):
            if before["real"] != after["real"]:
                changes.append(VerdictChange(key[0], key[1], key[2],
                                             f"{before['real']} at {before['site']}",
                                             f"{after['real']} at {after['site']}"))
    return changes
