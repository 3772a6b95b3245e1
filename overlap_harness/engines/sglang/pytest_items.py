"""The loop's runs as pytest items: ``pytest --sglang-src PATH`` or ``pytest --sglang-loop``
(the installed SGLang), with ``--sglang-variant NAME ...`` to choose (a pytest11 entry point
of the package; ``-p overlap_harness.engines.sglang.pytest_items`` where it is not installed).

One item per variant (fails on a race in the intact code, or when the tree cannot be driven)
and one per variant x removable sync site (runs the variant with the site removed in a forked
child; fails only when that run crashes; its verdict, necessary / redundant / not reached,
and races are in the item's ``user_properties`` and JUnit properties), by the core's items
(:mod:`overlap_harness.engines.core.pytest_items`). Items are named by variant and
``file:line``, so pytest-xdist spreads them; each process imports SGLang once. Nothing is
collected without ``--sglang-loop`` or ``--sglang-src``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.core.pytest_items import EngineItems, LoadedEngine, collect


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options."""
    group = parser.getgroup("sglang-loop", "SGLang's own overlap loop under the recorder")
    group.addoption("--sglang-loop", action="store_true", default=False,
                    help="collect the SGLang loop items (variants, variant x sync site)")
    group.addoption("--sglang-src", default=None, metavar="PATH",
                    help="SGLang tree (the package's folder or a checkout); default: installed")
    group.addoption("--sglang-variant", action="append", default=None, metavar="NAME",
                    help="only this variant (repeatable)")


def _load(config: pytest.Config) -> LoadedEngine:
    """SGLang loaded once in this process, and its sites."""
    from overlap_harness.engines.sglang import environment
    from overlap_harness.engines.sglang.report.path_sites import path_sites, run_outcome

    tree = environment.load(config.getoption("--sglang-src"))
    return LoadedEngine(Path(str(tree.package_dir)), path_sites(), run_outcome)


def _variants(config: pytest.Config) -> list[str]:
    from overlap_harness.engines.sglang.variants import VARIANTS

    return config.getoption("--sglang-variant") or list(VARIANTS)


ENGINE = EngineItems("sglang-loop", "sglang loop", _load, _variants)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Append the loop's items when ``--sglang-loop`` or ``--sglang-src`` is given."""
    if config.getoption("--sglang-loop") or config.getoption("--sglang-src") is not None:
        items.extend(collect(session, ENGINE))
