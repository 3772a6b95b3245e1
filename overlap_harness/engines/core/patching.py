"""Set attributes of live modules and objects for the length of a block, then restore them:
the recorder's one patch-and-restore (:func:`overlap_harness.recorder.patching.patched`)
under the name the engine adapters use."""

from __future__ import annotations

from overlap_harness.recorder.patching import patched as attributes_set

__all__ = ["attributes_set"]
