"""An engine's runs as pytest items, engine-neutral: one item per variant (fails on a race in
the intact code, or when the tree cannot be driven) and one per variant x removable sync site
(runs the variant with the site removed in a forked child; fails only when that run crashes;
its verdict, necessary / redundant / not reached, and its race count are in the item's
``user_properties``, so in JUnit's properties). Items are named ``variant`` and
``variant[file:line]``, so pytest-xdist spreads them; each process loads the engine once.

An adapter is a pytest plugin of a few lines: its options, an :class:`EngineItems` that says
how to load the engine and which variants to run, and a ``pytest_collection_modifyitems``
that appends :func:`collect` when its flag is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the runtime imports are deferred: they import torch (the recorder), and
    # this plugin is loaded into every pytest session of an environment with the package
    from overlap_harness.engines.core.necessity import RunVariant
    from overlap_harness.engines.core.results import VariantOutcome
    from overlap_harness.engines.core.sites import SyncSite


@dataclass
class LoadedEngine:
    """An engine imported in this process: where its tree is, its sync sites, the function
    that runs one variant, and the intact runs made so far (by variant)."""

    source: Path
    sites: Sequence[SyncSite]
    run: RunVariant
    baseline: dict[str, VariantOutcome] = field(default_factory=dict)

    def intact(self, variant: str) -> VariantOutcome:
        """The intact run of ``variant`` (made once per process)."""
        if variant not in self.baseline:
            self.baseline[variant] = self.run(variant)
        return self.baseline[variant]


@dataclass(frozen=True)
class EngineItems:
    """What an adapter hands the core: the collector's name (``sglang-loop``), the words
    the items' report lines start with, how to load the engine from the pytest options, and
    which variants the options ask for."""

    name: str
    label: str
    load: Callable[[pytest.Config], LoadedEngine]
    variants: Callable[[pytest.Config], list[str]]


_LOADED: dict[str, LoadedEngine] = {}  # by EngineItems.name: one load per process


def loaded(engine: EngineItems, config: pytest.Config) -> LoadedEngine:
    """``engine`` loaded once in this process."""
    if engine.name not in _LOADED:
        _LOADED[engine.name] = engine.load(config)
    return _LOADED[engine.name]


class EngineCollector(pytest.Collector):
    """The collector of one engine's items (named by :attr:`EngineItems.name`)."""

    def __init__(self, *, engine: EngineItems, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine = engine

    def collect(self) -> Iterator[pytest.Item]:
        from overlap_harness.engines.core.necessity import MUTABLE_KINDS

        engine = loaded(self.engine, self.config)
        for variant in self.engine.variants(self.config):
            yield VariantItem.from_parent(self, name=variant, engine=self.engine,
                                          variant=variant)
            for site in engine.sites:
                if site.kind in MUTABLE_KINDS:
                    yield SiteItem.from_parent(self, name=f"{variant}[{site.key}]",
                                               engine=self.engine, variant=variant, site=site)


class VariantItem(pytest.Item):
    """The intact code for one variant: race-free, and drivable."""

    def __init__(self, *, engine: EngineItems, variant: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.variant = engine, variant

    def runtest(self) -> None:
        outcome = _LOADED[self.engine.name].intact(self.variant)
        if outcome.error is not None:
            raise AssertionError(f"cannot be driven on this tree: {outcome.error}")
        if outcome.races:
            raise AssertionError(f"{len(outcome.races)} races, e.g. {outcome.races[0]}")

    def reportinfo(self) -> tuple[Path, int, str]:
        return _LOADED[self.engine.name].source, 0, f"{self.engine.label}: {self.variant}"


class SiteItem(pytest.Item):
    """One variant with one sync site removed: its verdict, computed in a forked child."""

    def __init__(self, *, engine: EngineItems, variant: str, site: SyncSite,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.engine, self.variant, self.site = engine, variant, site

    def runtest(self) -> None:
        from overlap_harness.engines.core.necessity import necessity_table

        engine = _LOADED[self.engine.name]
        baseline = {self.variant: engine.intact(self.variant)}
        [row] = necessity_table([self.site], [self.variant], baseline, engine.run, jobs=1)
        self.user_properties += [("verdict", str(row.verdict)), ("races", len(row.races))]
        if row.verdict == "error":
            raise AssertionError(f"{self.site.key} removed: the run crashed: {row.error}")

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path(self.site.file), self.site.line - 1, f"{self.variant}: {self.site.code}"


def collect(session: pytest.Session, engine: EngineItems) -> list[pytest.Item]:
    """Every item of ``engine`` (its variants, and each variant x removable site)."""
    collector = EngineCollector.from_parent(session, name=engine.name, engine=engine)
    return list(collector.collect())
