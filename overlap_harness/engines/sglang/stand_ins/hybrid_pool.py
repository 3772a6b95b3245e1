"""A stand-in for a hybrid (mamba / linear-attention) model's request pool, as the multi-layer
EAGLE worker sees it.

SGLang's ``MultiLayerEagleDraftWorker._init_boundary_kv_fix_state`` turns the boundary-KV
window on only for a ``HybridReqToTokenPool`` (``isinstance``), and reads one thing of its
mamba side: the shape of the first conv state (``mamba_pool.mamba_cache.conv[0]``), whose
conv-window axis gives the window's warm-up rows. A real hybrid pool needs a hybrid model's
configuration (its mamba layers, state shapes) and brings the scheduler's mamba paths with it
(per-request mamba slots allocated and freed, copy-on-write, a mamba-aware cache), none of
which this stand-in drives.

:class:`HybridPoolView` is a ``HybridReqToTokenPool`` by class only: made without SGLang's
``__init__``, it shows the scheduler's own ``ReqToTokenPool`` (its ``req_to_token``, the same
tensor, and the other names in :data:`SHOWN`) and a strict mamba side holding one conv state
of shape ``(1, rows, CONV_WINDOW, CONV_DIM)`` (the ``(kernel - 1, dim)`` layout a Kimi-linear
state has; every release reads the window from it: ``shape[2]``, or ``min(shape[2:])`` from
0.5.21). Any other name raises :class:`~overlap_harness.engines.core.strict.UnplannedUseError`,
inherited methods included: a path that uses the hybrid pool beyond this fails loudly.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.core.strict import StrictStub, UnplannedUseError

#: a short conv of kernel width 3: two warm-up rows in front of the window
CONV_WINDOW = 2
CONV_DIM = 4
#: the scheduler's pool's names the view shows as its own
SHOWN = frozenset({"req_to_token", "size", "max_context_len", "device"})
_OWN = frozenset({"_plain", "mamba_pool"})


def hybrid_pool_view(plain: Any) -> Any:
    """The scheduler's request pool ``plain`` seen as a hybrid model's (SGLang's
    ``HybridReqToTokenPool`` class, the conv state's shape); its ``req_to_token`` is
    ``plain``'s."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    class HybridPoolView(HybridReqToTokenPool):
        """The scheduler's request pool shown as a hybrid one (module docstring)."""

        def __getattribute__(self, name: str) -> Any:
            if name.startswith("__") and name.endswith("__"):
                return object.__getattribute__(self, name)
            if name in _OWN:
                return object.__getattribute__(self, name)
            if name in SHOWN:
                return getattr(object.__getattribute__(self, "_plain"), name)
            raise UnplannedUseError(f"hybrid_pool_view.{name}: not planned by the driver "
                                    "(the stand-in shows only the conv state's shape and "
                                    f"{sorted(SHOWN)})")

        def __setattr__(self, name: str, value: Any) -> None:
            raise UnplannedUseError(f"hybrid_pool_view.{name} set: not planned by the driver")

    view = object.__new__(HybridPoolView)
    rows = plain.req_to_token.shape[0]
    conv = torch.zeros((1, rows, CONV_WINDOW, CONV_DIM), dtype=torch.float32,
                       device=plain.req_to_token.device)
    object.__setattr__(view, "_plain", plain)
    object.__setattr__(view, "mamba_pool", StrictStub(
        "hybrid_pool_view.mamba_pool", mamba_cache=StrictStub(
            "hybrid_pool_view.mamba_pool.mamba_cache", conv=[conv])))
    return view
