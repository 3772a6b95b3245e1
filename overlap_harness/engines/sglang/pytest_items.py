"""The loop's runs as pytest items: ``pytest -p overlap_harness.engines.sglang.pytest_items
--sglang-loop [--sglang-src PATH] [--sglang-variant NAME ...]``.

One item per variant (fails on a race in the intact code, or when the tree cannot be driven)
and one per variant x removable sync site (runs the variant with the site removed in a forked
child; fails only when that run crashes; its verdict, necessary / redundant / not reached,
and races are in the item's ``user_properties`` and JUnit properties). Items are named by
variant and ``file:line``, so pytest-xdist spreads them; each process imports SGLang once.
Nothing is collected without ``--sglang-loop``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_LOADED: dict[str, Any] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options."""
    group = parser.getgroup("sglang-loop", "SGLang's own overlap loop under the recorder")
    group.addoption("--sglang-loop", action="store_true", default=False,
                    help="collect the SGLang loop items (variants, variant x sync site)")
    group.addoption("--sglang-src", default=None, metavar="PATH",
                    help="SGLang tree (the package's folder or a checkout); default: installed")
    group.addoption("--sglang-variant", action="append", default=None, metavar="NAME",
                    help="only this variant (repeatable)")


def _load(config: pytest.Config) -> dict[str, Any]:
    """SGLang loaded once in this process, its baseline runs, and its sites."""
    if not _LOADED:
        from overlap_harness.engines.sglang import environment
        from overlap_harness.engines.sglang.path_sites import path_sites, run_outcome

        _LOADED["tree"] = environment.load(config.getoption("--sglang-src"))
        _LOADED["sites"] = path_sites()
        _LOADED["run"] = run_outcome
        _LOADED["baseline"] = {}
    return _LOADED


def _variants(config: pytest.Config) -> list[str]:
    from overlap_harness.engines.sglang.variants import VARIANTS

    return config.getoption("--sglang-variant") or list(VARIANTS)


class SglangLoop(pytest.Collector):
    """The collector of the loop's items (named ``sglang-loop``)."""

    def collect(self) -> Iterator[pytest.Item]:
        from overlap_harness.engines.core.necessity import MUTABLE_KINDS

        loaded = _load(self.config)
        for variant in _variants(self.config):
            yield VariantItem.from_parent(self, name=variant, variant=variant)
            for site in loaded["sites"]:
                if site.kind in MUTABLE_KINDS:
                    yield SiteItem.from_parent(self, name=f"{variant}[{site.key}]",
                                               variant=variant, site=site)


def _baseline(variant: str) -> Any:
    baseline = _LOADED["baseline"]
    if variant not in baseline:
        baseline[variant] = _LOADED["run"](variant)
    return baseline[variant]


class VariantItem(pytest.Item):
    """The intact loop for one variant: race-free, and drivable."""

    def __init__(self, *, variant: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant = variant

    def runtest(self) -> None:
        outcome = _baseline(self.variant)
        if outcome.error is not None:
            raise AssertionError(f"cannot be driven on this tree: {outcome.error}")
        if outcome.races:
            raise AssertionError(f"{len(outcome.races)} races, e.g. {outcome.races[0]}")

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path(str(_LOADED["tree"].package_dir)), 0, f"sglang loop: {self.variant}"


class SiteItem(pytest.Item):
    """One variant with one sync site removed: its verdict, computed in a forked child."""

    def __init__(self, *, variant: str, site: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant = variant
        self.site = site

    def runtest(self) -> None:
        from overlap_harness.engines.core.necessity import necessity_table

        baseline = {self.variant: _baseline(self.variant)}
        [row] = necessity_table([self.site], [self.variant], baseline, _LOADED["run"], jobs=1)
        self.user_properties += [("verdict", str(row.verdict)), ("races", len(row.races))]
        if row.verdict == "error":
            raise AssertionError(f"{self.site.key} removed: the run crashed: {row.error}")

    def reportinfo(self) -> tuple[Path, int, str]:
        return Path(self.site.file), self.site.line - 1, f"{self.variant}: {self.site.code}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Append the loop's items when ``--sglang-loop`` is given."""
    if not config.getoption("--sglang-loop"):
        return
    collector = SglangLoop.from_parent(session, name="sglang-loop")
    items.extend(collector.collect())
