"""vLLM's variants as pytest items: ``pytest --vllm-src PATH`` or ``pytest --vllm-async`` (the
installed vLLM), with ``--vllm-variant NAME ...`` to choose (a pytest11 entry point of the
package; ``-p overlap_harness.engines.vllm.pytest_items`` where it is not installed).

One item per variant the tree has the code of (race-free as released, drivable; the others are
not collected, :mod:`.release_features`) and one per variant x removable sync
site of the driven functions (its verdict in the item's properties), by the core's items
(:mod:`overlap_harness.engines.core.pytest_items`). Nothing is collected without
``--vllm-async`` or ``--vllm-src``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.core.pytest_items import EngineItems, LoadedEngine, collect


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options."""
    group = parser.getgroup("vllm-async", "vLLM's own async-scheduling code under the recorder")
    group.addoption("--vllm-async", action="store_true", default=False,
                    help="collect vLLM's items (variants, variant x sync site)")
    group.addoption("--vllm-src", default=None, metavar="PATH",
                    help="vLLM tree (a folder holding the vllm package); default: installed")
    group.addoption("--vllm-variant", action="append", default=None, metavar="NAME",
                    help="only this variant (repeatable)")


def _load(config: pytest.Config) -> LoadedEngine:
    from overlap_harness.engines.vllm import environment, necessity

    info = environment.load(config.getoption("--vllm-src"))
    return LoadedEngine(Path(info.location), necessity.sites(), necessity.run_outcome)


def _variants(config: pytest.Config) -> list[str]:
    """The variants asked for that the loaded tree has the code of (the core asks after
    loading it); naming one it lacks is a usage error with the reason."""
    from overlap_harness.engines.vllm.necessity import variant_runs
    from overlap_harness.engines.vllm.release_features import not_applicable_reason

    asked = config.getoption("--vllm-variant")
    names = asked or list(variant_runs())
    lacking = {name: reason for name in names
               if (reason := not_applicable_reason(name)) is not None}
    if asked and lacking:
        raise pytest.UsageError("; ".join(f"--vllm-variant {name}: not applicable ({reason})"
                                          for name, reason in lacking.items()))
    return [name for name in names if name not in lacking]


ENGINE = EngineItems("vllm-async", "vllm", _load, _variants)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Append vLLM's items when ``--vllm-async`` or ``--vllm-src`` is given."""
    if config.getoption("--vllm-async") or config.getoption("--vllm-src") is not None:
        items.extend(collect(session, ENGINE))
