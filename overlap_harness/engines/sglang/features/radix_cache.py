"""SGLang's radix prefix cache (on unless ``--disable-radix-cache``): prompts that share a
prefix reuse its KV, and the cache rewrites request rows the forward may still read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.sglang.features.api import Feature

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.variants import Variant


@dataclass(frozen=True, slots=True)
class RadixCache(Feature):
    """The radix cache on (without this feature the variant runs SGLang's no-sharing cache,
    as with ``--disable-radix-cache``)."""

    keys: ClassVar[tuple[str, ...]] = ("radix_cache",)
    options: ClassVar[tuple[str, ...]] = ("--disable-radix-cache",)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"radix_cache": "on"}

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        options["disable_radix_cache"] = False
