"""Which sync sites each variant reaches in the intact code, from one probed run.

The necessity table removes one site at a time and reruns every variant; most (site, variant)
pairs are never reached (SGLang 0.5.23: 443 of 616 rows), and a removal the run never reaches
changes nothing, so its verdict is "not reached" without running it. This module finds them
first: in a forked child, every site's function is recompiled from its file with a counting
call inserted before each site's statement (the statement kept; the same recompilation as
:func:`overlap_harness.engines.core.mutation.remove_site`), and each variant is run once;
the counts per variant are the sites it reaches. A function that cannot be recompiled leaves
its sites unknown (every variant runs for them).

An adapter whose command runs every variant intact anyway (SGLang's) places the probes in
its own process before those runs instead (:class:`IntactReach`): the intact runs then say
which sites they reach, and the table needs no probed pass of its own (one run per variant
fewer). The probes are the same recompilation; a probed function does what it did, plus one
counting call before each site's statement.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from overlap_harness.engines.core import mutation
from overlap_harness.engines.core.mutation import REACHED_HOOK, Coverage, MutationError
from overlap_harness.engines.core.sites import SyncSite


def probe_key(site: SyncSite) -> str:
    """The site's name in the probed pass: its whole path and line (``SyncSite.key`` names
    the file only, and two files of one name may hold a site on the same line)."""
    return f"{site.file}:{site.line}"


def _insert_probes(function: ast.AST, sites: Sequence[SyncSite]) -> set[str]:
    """Put ``REACHED_HOOK(key)`` before each site's statement in ``function``; the
    :func:`probe_key` of the sites whose statement was found."""
    by_line = {site.line: site for site in sites}
    placed: set[str] = set()
    for node in ast.walk(function):
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, field_name, None)
            if not isinstance(block, list):
                continue
            index = 0
            while index < len(block):
                statement = block[index]
                site = by_line.get(getattr(statement, "lineno", -1))
                if isinstance(statement, ast.stmt) and site is not None \
                        and probe_key(site) not in placed:
                    hook = ast.Expr(ast.Call(ast.Name(REACHED_HOOK, ast.Load()),
                                             [ast.Constant(probe_key(site))], []))
                    ast.copy_location(hook, statement)
                    ast.fix_missing_locations(hook)
                    block.insert(index, hook)
                    placed.add(probe_key(site))
                    index += 1
                index += 1
    return placed


def probe_sites(sites: Sequence[SyncSite], coverage: Coverage) -> set[str]:
    """Recompile each function holding ``sites`` with a count before each site (see the
    module doc); the :func:`probe_key` of the sites now counted. Sites in one outermost
    function (nested functions included) are probed in one recompilation. Meant for a
    forked child."""
    groups: dict[tuple[str, tuple[str, ...], str], list[SyncSite]] = defaultdict(list)
    for file, in_file in _by_file(sites).items():
        try:
            tree = mutation.parsed(file)
        except (OSError, SyntaxError):
            continue  # these sites stay unknown: every variant runs for them
        for site in in_file:
            try:
                classes, function = mutation._find(tree, site)
            except MutationError:
                continue
            groups[(file, tuple(classes), function.name)].append(site)
    probed: set[str] = set()
    for group in groups.values():
        try:
            probed |= mutation.recompile(group[0], coverage,
                                         lambda tree, group=group: _insert_probes(tree, group))
        except MutationError:
            continue
    return probed


def _by_file(sites: Sequence[SyncSite]) -> dict[str, list[SyncSite]]:
    by_file: dict[str, list[SyncSite]] = defaultdict(list)
    for site in sites:
        by_file[site.file].append(site)
    return by_file


def reached_by_variant(sites: Sequence[SyncSite], variants: Sequence[str],
                       run: Callable[[str], Any]) -> tuple[set[str], dict[str, set[str]]]:
    """The :func:`probe_key` of the sites probed, and per variant those its intact run
    reaches (a probed site in no variant's set is reached by none); a variant whose probed
    run crashes is left out (its reach is unknown). Run this in a forked child: the probes
    stay. Nothing is run when no site could be probed."""
    coverage = Coverage()
    probed = probe_sites(sites, coverage)
    reached: dict[str, set[str]] = {}
    if not probed:
        return probed, reached
    for variant in variants:
        before = dict(coverage.reached)
        try:
            outcome = run(variant)
        except Exception:  # unknown reach: the sites' own children say why
            continue
        if getattr(outcome, "error", None) is not None:
            continue  # a crash is never read as not reached: every site runs this variant
        reached[variant] = {key for key, count in coverage.reached.items()
                            if count > before.get(key, 0)}
    return probed, reached


@dataclass
class IntactReach:
    """Probes placed in this process (:func:`probe_sites`), counted by the runs that
    :meth:`counted` wraps: after them, :attr:`probed` and :attr:`reached` are what
    :func:`reached_by_variant` returns, from the intact runs themselves. Nothing is
    undone: processes forked later inherit the probes (a site's removal recompiles its
    function from the file again, without them)."""

    sites: Sequence[SyncSite]
    coverage: Coverage = field(default_factory=Coverage)
    probed: set[str] = field(default_factory=set)
    reached: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.probed = probe_sites(self.sites, self.coverage)

    def counted(self, run: Callable[[str], Any]) -> Callable[[str], Any]:
        """``run`` noting the probed sites each variant's run reaches (a variant whose run
        raises or ends with an ``error`` is left out: its reach is unknown)."""
        def run_counted(variant: str) -> Any:
            before = dict(self.coverage.reached)
            outcome = run(variant)
            if self.probed and getattr(outcome, "error", None) is None:
                self.reached[variant] = {key for key, count in self.coverage.reached.items()
                                         if count > before.get(key, 0)}
            return outcome
        return run_counted
