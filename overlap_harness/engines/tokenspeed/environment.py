"""TokenSpeed imported once from a tree (an unzipped wheel, a checkout's ``python`` folder or
a site-packages), its compiled packages stood in where missing
(:mod:`.stand_ins.packages`).

What the driver needs is checked by feature, never by version: the forward thread
(``runtime/execution/forward_thread.py``: ``ForwardThread``), the device handle
(``runtime/execution/device.py``: ``DeviceHandle``), the executor's ``execute_forward_op`` and
the event loop's ``event_loop``. TokenSpeed 0.1.0 has none of the first two (its event loop
issued the forwards itself): such a tree is refused with the missing feature named.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from overlap_harness.engines.core.engine_output import captured
from overlap_harness.engines.tokenspeed.errors import TokenSpeedUnavailable

DRIVEN_MODULES = (
    "tokenspeed.runtime.execution.forward_thread",
    "tokenspeed.runtime.execution.types",
    "tokenspeed.runtime.execution.runtime_states",
    "tokenspeed.runtime.execution.input_buffer",
    "tokenspeed.runtime.execution.device",
    "tokenspeed.runtime.execution.model_executor",
    "tokenspeed.runtime.sampling.backends.flashinfer",
    "tokenspeed.runtime.engine.event_loop",
)
#: (module, attribute) the driver builds on; a tree without one cannot be driven
FEATURES = (
    ("tokenspeed.runtime.execution.forward_thread", "ForwardThread"),
    ("tokenspeed.runtime.execution.device", "DeviceHandle"),
    ("tokenspeed.runtime.execution.model_executor", "ModelExecutor.execute_forward_op"),
    ("tokenspeed.runtime.engine.event_loop", "EventLoop.event_loop"),
    ("tokenspeed.runtime.sampling.backends.flashinfer",
     "FlashInferSamplingBackend._prepare_step_hook"),
)


@dataclass(frozen=True, slots=True)
class TokenSpeedInfo:
    """The TokenSpeed imported: version, where, what was stood in, the import's time."""

    version: str
    location: str
    stood_in: tuple[str, ...]
    import_seconds: float


_IMPORTED: list[TokenSpeedInfo] = []


def tree_root(src: str | None) -> Path | None:
    """The folder to put first on ``sys.path`` for ``--tokenspeed-src PATH`` (an unzipped
    wheel, a site-packages, the package itself, a checkout); None for the installed one.

    Raises:
        TokenSpeedUnavailable: PATH is not a folder or holds no ``tokenspeed`` package.
    """
    from overlap_harness.engines.core.engine_command import package_root

    return package_root(src, "tokenspeed", TokenSpeedUnavailable)


def _check_features() -> None:
    for module_name, path in FEATURES:
        owner: object = sys.modules[module_name]
        for part in path.split("."):
            if not hasattr(owner, part):
                raise TokenSpeedUnavailable(
                    f"this tree has no {module_name}.{path}: the driver builds on it (the "
                    "one-forward-thread design of TokenSpeed 0.1.1)")
            owner = getattr(owner, part)


def import_tokenspeed() -> TokenSpeedInfo:
    """Import the driven modules (once per process), stand-ins installed first.

    Raises:
        TokenSpeedUnavailable: an import fails (its error named) or a feature is missing.
    """
    if _IMPORTED:
        return _IMPORTED[0]
    from overlap_harness.engines.tokenspeed.stand_ins import packages

    start = time.perf_counter()
    stood_in = packages.install()
    name = DRIVEN_MODULES[0]
    try:
        with captured("tokenspeed import"):
            for name in DRIVEN_MODULES:
                importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or str(exc)
        if missing.startswith("tokenspeed.runtime.execution.forward_thread") or (
                missing.startswith("tokenspeed.runtime.execution.device")):
            raise TokenSpeedUnavailable(
                f"this tree has no {missing}: the driver builds on TokenSpeed's forward "
                "thread and device handle (0.1.1's one-forward-thread design)") from exc
        raise TokenSpeedUnavailable(f"cannot import {name}: {type(exc).__name__}: "
                                    f"{exc}") from exc
    except Exception as exc:  # any import failure: the caller skips or exits 2 with it
        raise TokenSpeedUnavailable(f"cannot import {name}: {type(exc).__name__}: "
                                    f"{exc}") from exc
    _check_features()
    import tokenspeed

    try:
        version = importlib.import_module("tokenspeed.version").__version__
    except (ImportError, AttributeError):
        version = getattr(tokenspeed, "__version__", "unknown")
    info = TokenSpeedInfo(str(version), str(Path(tokenspeed.__path__[0]).resolve()),
                          tuple(stood_in), time.perf_counter() - start)
    _IMPORTED.append(info)
    return info


def load(src: str | None = None) -> TokenSpeedInfo:
    """Import TokenSpeed from ``src`` (see :func:`tree_root`; None: the installed one), once.

    Raises:
        TokenSpeedUnavailable: not a TokenSpeed tree, an import fails, or TokenSpeed was
            already imported from elsewhere in this process.
    """
    root = tree_root(src)
    if root is not None:
        sys.path.insert(0, str(root))
    info = import_tokenspeed()
    if root is not None and not Path(info.location).is_relative_to(root.resolve()):
        raise TokenSpeedUnavailable(f"--tokenspeed-src {src}: tokenspeed was imported from "
                                    f"{info.location}, not from this tree")
    return info
