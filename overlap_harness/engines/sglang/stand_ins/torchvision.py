"""Strict stand-ins for the few ``torchvision`` names SGLang touches when it is imported.

torchvision has no wheel that installs beside the CPU torch this project pins, and SGLang's
scheduler imports it only through multimodal processors and configs that the overlap loop never
runs. Those modules import ``torchvision.transforms`` (and ``.functional``, ``.v2``,
``.v2.functional``) and ``torchvision.io``, and import names from them (``decode_jpeg``,
``Normalize``: which ones differs between releases). ``InterpolationMode`` is given (its
members are read at import as default arguments); any other name is answered by a
:class:`~overlap_harness.engines.core.strict.StrictName` that raises
:class:`~overlap_harness.engines.core.strict.UnplannedUseError` with its name when called,
tested or iterated, so a code path that really needs torchvision fails loudly instead of
running on a stand-in. Installed only when the real torchvision is not importable.
"""

from __future__ import annotations

import enum
import importlib.util
import sys

from overlap_harness.engines.core.strict import StrictModule, strict_module


class InterpolationMode(enum.Enum):
    """The member names torchvision's enum has (SGLang's processors name them as defaults)."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def _modules() -> list[StrictModule]:
    doc = "Strict stand-in (overlap_harness.engines.sglang.stand_ins.torchvision): not torchvision."
    functional = strict_module("torchvision.transforms.functional", doc,
                               {"InterpolationMode": InterpolationMode}, open_names=True)
    v2_functional = strict_module("torchvision.transforms.v2.functional", doc, {},
                                  open_names=True)
    v2 = strict_module("torchvision.transforms.v2", doc, {"functional": v2_functional},
                       open_names=True)
    transforms = strict_module("torchvision.transforms", doc,
                               {"InterpolationMode": InterpolationMode,
                                "functional": functional, "v2": v2}, open_names=True)
    io = strict_module("torchvision.io", doc, {}, open_names=True)
    root = strict_module("torchvision", doc, {"transforms": transforms, "io": io},
                         open_names=True)
    return [root, transforms, functional, v2, v2_functional, io]


def install_if_missing() -> bool:
    """Put the stand-ins into ``sys.modules`` when torchvision is not installed; True if done.

    transformers asks ``importlib`` whether torchvision is installed (and caches the answer);
    it is asked first, so it hears the truth (not installed) before the stand-ins go in."""
    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return False
    try:
        from transformers.utils import import_utils
    except ImportError:
        pass
    else:
        import_utils.is_torchvision_available()
    for module in _modules():
        sys.modules[module.__name__] = module
    return True
