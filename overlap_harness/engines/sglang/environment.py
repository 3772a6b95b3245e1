"""Import SGLang (the installed one, or a user's tree) and select its CUDA code paths on a CPU.

SGLang decides its platform when its modules are imported: ``_is_cuda`` / ``_is_hip`` flags
fixed from ``torch.cuda`` (false on a CPU build), and ``is_pin_memory_available`` answered by
the platform object (false on a CPU). On the CPU branches ``async_d2h`` and the batch staging
copy blocking, which hides the very races the overlap loop is built to avoid, so
:func:`cuda_selected` switches the flags of the modules on the overlap path and the platform's
pinned-memory answer for the length of a run (HIP selectable). The recorder fakes the CUDA
streams, events and pinned memory these branches then use.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from overlap_harness.engines.core.engine_output import captured
from overlap_harness.engines.core.patching import attributes_set
from overlap_harness.engines.core.tree_errors import import_failure
from overlap_harness.engines.sglang.stand_ins import sgl_kernel as sgl_kernel_stub
from overlap_harness.engines.sglang.stand_ins import torchvision as torchvision_stub
from overlap_harness.model.errors import HarnessError

SUPPORTED_VERSION = "0.5.23"

#: the modules the driver needs, imported once per process
PATH_MODULES = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tp_worker",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.model_executor.model_runner",
)

#: modules whose import-time platform flags choose branches on the overlap path
FLAGGED_MODULES = (
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.scheduler_components.batch_result_processor",
    "sglang.srt.mem_cache.allocation",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.speculative.eagle_worker_v2",
    "sglang.srt.speculative.eagle_worker_common",
)


class SglangTreeError(HarnessError):
    """SGLang cannot be imported from the tree asked for, or differs from what is driven."""


@dataclass(frozen=True, slots=True)
class SglangTree:
    """The SGLang imported in this process: where its package lies, its version, how long
    the import of :data:`PATH_MODULES` took (wall seconds)."""

    package_dir: Path
    version: str
    import_s: float


def package_root(source: str | None) -> Path | None:
    """The directory to put first on ``sys.path`` for ``--sglang-src``: ``source`` itself
    when it holds ``sglang/``, its ``python/`` when it is a repository checkout; None for
    the installed SGLang. Raises :class:`SglangTreeError` when neither holds the package."""
    if source is None:
        return None
    root = Path(source).expanduser().resolve()
    for candidate in (root, root / "python"):
        if (candidate / "sglang" / "__init__.py").is_file():
            return candidate
    raise SglangTreeError(f"{source}: no sglang package here or in its python/ folder")


def load(source: str | None = None) -> SglangTree:
    """Import SGLang's overlap path once for this process, from ``source`` (see
    :func:`package_root`) or the installed package; raises :class:`SglangTreeError`."""
    root = package_root(source)
    loaded = sys.modules.get("sglang")
    if loaded is not None:
        return _already_loaded(loaded, root)
    if root is not None:
        sys.path.insert(0, str(root))
    torchvision_stub.install_if_missing()
    sgl_kernel_stub.install_if_missing()  # a CUDA host without SGLang's compiled kernels
    started = time.perf_counter()
    try:
        with captured("sglang import"), _configs_registered_beside_transformers():
            # the engine's own warnings, summed up in one line
            for name in PATH_MODULES:
                importlib.import_module(name)
    except Exception as exc:  # a syntax error, a missing package, a crash at import time
        hint = " (docs/sglang-loop.md: install)" if isinstance(exc, ImportError) else ""
        where = import_failure(exc, root if root is not None else _installed_root())
        raise SglangTreeError(f"import {name} failed: {where}{hint}") from None
    elapsed = time.perf_counter() - started
    package = Path(os.path.abspath(sys.modules["sglang"].__file__)).parent
    if root is not None and package.parent != root:
        raise SglangTreeError(f"{source}: sglang was imported from {package}, not this tree")
    return SglangTree(package, _version(package), elapsed)


def _installed_root() -> Path | None:
    """The folder holding the installed (or already found) sglang package, if any."""
    spec = importlib.util.find_spec("sglang") if "sglang" not in sys.modules else None
    module = sys.modules.get("sglang")
    origin = module.__file__ if module is not None else (spec.origin if spec else None)
    return Path(origin).resolve().parents[1] if origin else None


@contextmanager
def _configs_registered_beside_transformers() -> Iterator[None]:
    """``AutoConfig.register`` for the block: a model type that transformers itself already
    defines is registered over it (``exist_ok``) instead of raising. An older release
    registers its own config class for a model type that a newer transformers has since
    added (0.5.17's ``qwen3_asr``); the overlap loop never loads such a model, and the
    release's module must still import beside the transformers installed here."""
    try:
        from transformers import AutoConfig
    except ImportError:
        yield
        return
    register = AutoConfig.register

    def register_beside(model_type: str, config: type, exist_ok: bool = False) -> None:
        register(model_type, config, exist_ok=True)

    with attributes_set([(AutoConfig, "register", staticmethod(register_beside))]):
        yield


def _already_loaded(module: types.ModuleType, root: Path | None) -> SglangTree:
    package = Path(os.path.abspath(module.__file__)).parent
    if root is not None and package.parent != root:
        raise SglangTreeError(f"sglang is already imported from {package} in this process")
    for name in PATH_MODULES:
        importlib.import_module(name)
    return SglangTree(package, _version(package), 0.0)


def _version(package: Path) -> str:
    """The tree's own version (``sglang/version.py``), else the installed distribution's."""
    version_file = package / "version.py"
    if version_file.is_file():
        scope: dict[str, object] = {}
        exec(compile(version_file.read_text(), str(version_file), "exec"), scope)
        if isinstance(scope.get("__version__"), str):
            return str(scope["__version__"])
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@contextmanager
def cuda_selected(*, hip: bool = False) -> Iterator[None]:
    """SGLang's CUDA (or HIP) branches for the block: the ``_is_cuda``/``_is_hip`` flags of
    :data:`FLAGGED_MODULES` where they have them, pinned memory available, Triton supported
    (the kernels it then launches are declared in :mod:`.stand_ins.loop_kernels`)."""
    from sglang.srt.platforms import current_platform  # deferred: imported by load()

    changes: list[tuple[object, str, object]] = []
    for name in FLAGGED_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for flag, value in (("_is_cuda", not hip), ("_is_hip", hip), ("_is_npu", False)):
            if hasattr(module, flag):
                changes.append((module, flag, value))
    changes.append((current_platform, "is_pin_memory_available", _pinned_available))
    # the CUDA platform launches Triton kernels (the prefill's req_to_token writer among
    # them); a release whose platform has no capabilities record chooses them by _is_cuda
    if hasattr(current_platform, "capabilities"):
        changes.append((current_platform, "capabilities", msgspec.structs.replace(
            current_platform.capabilities, supports_triton=True)))
    with attributes_set(changes):
        yield


@contextmanager
def retraction_forced(every: int | None) -> Iterator[None]:
    """SGLang's retraction test hook (``SGLANG_TEST_RETRACT``, read into scheduler.py's
    globals at import) on for the block: a decode retracts at every ``every``-th forward,
    prefill never held back for it. Nothing changes for None."""
    if every is None:
        yield
        return
    module = sys.modules["sglang.srt.managers.scheduler"]
    with attributes_set([(module, "TEST_RETRACT", True), (module, "TEST_RETRACT_INTERVAL", every),
                         (module, "TEST_RETRACT_NO_PREFILL_BS", 1 << 20)]):
        yield


def _pinned_available(device: object = None) -> bool:
    """The CUDA platform's answer: host memory can be pinned."""
    return True


