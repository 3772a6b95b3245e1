"""Stand-ins for the compiled packages TokenSpeed imports: ``tokenspeed_kernel`` (its kernel
library, built for CUDA and torch 2.14), ``tokenspeed_scheduler`` (the C++ scheduler
extension) and ``tokenspeed_triton`` (the Triton build it bundles).

Why: ``tokenspeed_kernel`` 0.1.4 pins ``torch==2.14.0`` and ``tokenspeed-triton``; the
released ``tokenspeed-scheduler`` wheels (0.1.42 the newest) lack ``CacheGroupFamily``, which
``tokenspeed.runtime.engine.scheduler_utils`` of 0.1.1 imports at import time. The driven path
never runs their code: its kernels are the declared stand-ins of :mod:`.kernels`, its plans
come from :mod:`.front_end`.

So, where a real package is not importable, an import hook answers every module under these
two names with an open stand-in module: any name it is asked for is a :class:`StandInName`,
which can be held, annotated with (``X | None``) and have attributes taken, and fails loudly
(:class:`~overlap_harness.engines.core.strict.UnplannedUseError`) when called, tested,
iterated or compared. The few names the driven path uses are given values here:
``platform.current_platform()`` (an NVIDIA Hopper, strict), ``compile_monitor.compile_stats``
(no compiles), ``ops.metadata.Reg`` (register slots),
``ops.sampling.cuda.fused_topk_topp_available`` (False), the scheduler's ``ExecutionEvent``
(:mod:`.front_end`) and, from :mod:`.kernels`, the declared
kernels. ``tokenspeed_triton`` is the installed Triton under TokenSpeed's name (its ``jit``
decorates TokenSpeed's own kernels at import; their launches on the path are declared).
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from overlap_harness.engines.core.strict import StrictModule, StrictName, StrictStub

STANDS_IN_FOR = ("tokenspeed_kernel", "tokenspeed_scheduler")
MARKER = "__overlap_harness_stand_in__"


class StandInName(StrictName):
    """A name of a stand-in module: as :class:`StrictName`, and usable in a type annotation
    (``X | None``), which TokenSpeed's modules evaluate at import."""

    __slots__ = ()

    def __getattr__(self, name: str) -> StandInName:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandInName(f"{object.__getattribute__(self, '_qualified_name')}.{name}")

    def __or__(self, other: object) -> StandInName:
        return self

    __ror__ = __or__


class StandInModule(StrictModule):
    """A stand-in module: names set here are its values, any other is a :class:`StandInName`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return StandInName(f"{self.__name__}.{name}")


class Reg(enum.IntEnum):
    """The prep tape's register slots TokenSpeed's input buffers name (``Reg.BS``,
    ``Reg.TOKENS``); the values are the kernel package's own slot numbers."""

    BS = 0
    REAL_BS = 1
    TOKENS = 2


def hopper_platform() -> StrictStub:
    """``current_platform()``: an NVIDIA Hopper GPU (the answers TokenSpeed's modules ask of
    it at import and on the path); any other question fails with its name."""
    return StrictStub("current_platform()", is_nvidia=True, is_amd=False, is_cdna=False,
                      is_hopper=True, is_hopper_plus=True, is_blackwell=False, is_npu=False)


def _compile_stats() -> dict[str, int]:
    """No kernel was compiled (the stand-ins compile nothing)."""
    return {}


def _values() -> dict[str, dict[str, Any]]:
    from overlap_harness.engines.tokenspeed.stand_ins import front_end, kernels

    platform = hopper_platform()
    return {
        "tokenspeed_kernel.platform": {"current_platform": lambda: platform,
                                       "pdl_enabled": lambda *a, **k: False},
        "tokenspeed_kernel.compile_monitor": {"compile_stats": _compile_stats},
        # the fused top-k/top-p renorm kernel: absent (only a faster path of verify)
        "tokenspeed_kernel.ops.sampling.cuda": {"fused_topk_topp_available": False},
        "tokenspeed_scheduler": {"ExecutionEvent": front_end.ExecutionEventStandIn},
        "tokenspeed_kernel.ops.metadata": {
            "Reg": Reg, "PrepTape": kernels.PrepTapeStandIn,
            "advance_accepted_frontier": kernels.advance_accepted_frontier},
    }


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports under :data:`STANDS_IN_FOR` with stand-in modules."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] not in STANDS_IN_FOR:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name, "Stand-in (overlap_harness.engines.tokenspeed."
                               "stand_ins.packages): not TokenSpeed's compiled package.")
        module.__path__ = []
        setattr(module, MARKER, True)
        for key, value in _values().get(spec.name, {}).items():
            setattr(module, key, value)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def missing() -> list[str]:
    """The stood-in packages that are not importable here."""
    return [n for n in STANDS_IN_FOR
            if n not in sys.modules and importlib.util.find_spec(n) is None]


_FINDER = _Finder()


def install() -> list[str]:
    """From now on in this process, imports of the missing packages get stand-ins and
    ``tokenspeed_triton`` is the installed Triton (TokenSpeed's modules import them lazily
    too, so the hook stays); returns the names stood in."""
    names = missing()
    if names and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if "tokenspeed_triton" not in sys.modules and importlib.util.find_spec(
            "tokenspeed_triton") is None:
        import triton
        import triton.language

        sys.modules["tokenspeed_triton"] = triton
        sys.modules["tokenspeed_triton.language"] = triton.language
    return names
