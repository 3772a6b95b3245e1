"""SGLang's retraction test hook (``SGLANG_TEST_RETRACT``): a decoding request is retracted
at every n-th forward, requeued and prefilled again into a freed row."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.sglang import environment
from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


@dataclass(frozen=True, slots=True)
class Retraction(Feature):
    """Retract a decoding request every ``every``-th forward (SGLang's own test hook)."""

    options: ClassVar[tuple[str, ...]] = ("SGLANG_TEST_RETRACT", "SGLANG_TEST_RETRACT_INTERVAL")

    every: int = 4

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.RETRACT_HOOK]

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return environment.retraction_forced(self.every)
