"""Strict stand-ins for the ``sgl_kernel`` names SGLang imports on a CUDA host.

On a host where ``torch.cuda`` sees a device, SGLang's modules take their CUDA branches at
import and import its compiled kernel package, ``sgl_kernel`` (``from sgl_kernel import ...``
in the quantization, activation, layernorm, sampling and KV-transfer layers). No sglang-kernel
build matches every torch (none matches torch 2.11), and the overlap loop the harness drives
never launches these kernels: the model forward and the kernels on its path are the harness's
declared stand-ins (:mod:`.stand_ins.model_worker`, :mod:`.stand_ins.loop_kernels`,
:mod:`.stand_ins.eagle_kernels`, :mod:`.stand_ins.graph_kernels`), which run torch ops on the
device.

So, where no real ``sgl_kernel`` is importable and CUDA is available, these modules go into
``sys.modules``: exactly the names SGLang 0.5.23's path imports (found by importing its path
modules with CUDA selected: ``tests/test_sgl_kernel_stub.py`` repeats that on a CPU). Each is a
function that raises :class:`~overlap_harness.engines.core.strict.UnplannedUseError` naming
itself when called, except ``utils.is_arch_support_pdl`` (answers False: programmatic
dependent launch off, which only changes how fast kernels start). Any other name raises on
access; a submodule not listed (``sgl_kernel.scalar_type``) is absent, so SGLang takes its own
fallback for it. A real ``sgl_kernel`` always wins.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from overlap_harness.engines.core.strict import StrictModule, strict_module, unplanned

#: submodule ("" for the package) -> the names SGLang imports from it
IMPORTED_NAMES: dict[str, tuple[str, ...]] = {
    "": ("int8_scaled_mm", "moe_sum_reduce", "moe_sum", "fused_add_rmsnorm",
         "gemma_fused_add_rmsnorm", "gemma_rmsnorm", "rmsnorm", "gelu_and_mul",
         "gelu_tanh_and_mul", "silu_and_mul", "top_k_renorm_prob", "top_p_renorm_prob"),
    "quantization": ("ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8",
                     "ggml_mul_mat_vec_a8"),
    "kvcacheio": ("transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf",
                  "transfer_kv_all_layer_lf_pf", "transfer_kv_all_layer_lf_ph",
                  "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct",
                  "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
                  "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf",
                  "transfer_kv_per_layer_pf_lf", "transfer_kv_per_layer_ph_lf",
                  "transfer_kv_all_layer_mla"),
    "utils": ("is_arch_support_pdl",),
}

MARKER = "__overlap_harness_stand_in__"


def _is_arch_support_pdl(*args: Any, **kwargs: Any) -> bool:
    """Programmatic dependent launch: off (the stand-ins launch plain kernels)."""
    return False


#: names with a working stand-in: "submodule.name" -> implementation
IMPLEMENTED: dict[str, Callable[..., Any]] = {"utils.is_arch_support_pdl": _is_arch_support_pdl}


def modules() -> list[StrictModule]:
    """The stand-in package and its submodules (not installed)."""
    doc = ("Strict stand-in (overlap_harness.engines.sglang.stand_ins.sgl_kernel): not SGLang's "
           "compiled kernels.")
    subs = []
    for sub, names in IMPORTED_NAMES.items():
        if not sub:
            continue
        full = f"sgl_kernel.{sub}"
        subs.append(strict_module(full, doc, {
            n: IMPLEMENTED.get(f"{sub}.{n}") or unplanned(f"{full}.{n}") for n in names}))
    root_names: dict[str, Any] = {n: unplanned(f"sgl_kernel.{n}") for n in IMPORTED_NAMES[""]}
    root_names.update({m.__name__.split(".")[1]: m for m in subs})
    root = strict_module("sgl_kernel", doc, root_names)
    for module in (root, *subs):
        setattr(module, MARKER, True)
    return [root, *subs]


def needed() -> bool:
    """True where SGLang will import ``sgl_kernel`` and cannot: CUDA is available and no
    ``sgl_kernel`` is installed."""
    import torch

    if "sgl_kernel" in sys.modules or importlib.util.find_spec("sgl_kernel") is not None:
        return False
    return bool(torch.cuda.is_available() and torch.version.cuda is not None)


def install_if_missing() -> bool:
    """Put the stand-ins into ``sys.modules`` when :func:`needed`; True if done."""
    if not needed():
        return False
    install()
    return True


def install() -> None:
    """Put the stand-ins into ``sys.modules`` (for a CUDA host, or a test pretending one)."""
    for module in modules():
        sys.modules[module.__name__] = module
