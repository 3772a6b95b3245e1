"""The overlap loop's HIP branches (SGLang's ``_is_hip``): the result copied on the forward
stream without a copy stream, FutureMap's resolves waiting on the publish event from the
host. Selected by :func:`..environment.cuda_selected` (``hip=True``) and, for speculative
workers, by their spec-v2 helpers' flags (:func:`.eagle.selected`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


@dataclass(frozen=True, slots=True)
class Hip(Feature):
    """The loop on an AMD GPU: SGLang's HIP branches instead of its CUDA ones."""

    keys: ClassVar[tuple[str, ...]] = ("platform",)
    options: ClassVar[tuple[str, ...]] = ("a ROCm build (SGLang's _is_hip)",)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"platform": "hip"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.HIP_BRANCHES]
