"""Chunked prefill (``--chunked-prefill-size``), optionally with the chunks mixed into
decode batches (``--enable-mixed-chunk``): SGLang's own scheduling of both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.sglang.features.api import Feature, on_off

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.variants import Variant


@dataclass(frozen=True, slots=True)
class ChunkedPrefill(Feature):
    """Prompts prefilled in chunks of ``size`` tokens; ``mixed``: beside decodes."""

    keys: ClassVar[tuple[str, ...]] = ("chunked_prefill", "mixed_chunk")
    options: ClassVar[tuple[str, ...]] = ("--chunked-prefill-size", "--enable-mixed-chunk")

    size: int = 4
    mixed: bool = False

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"chunked_prefill": "on", "mixed_chunk": on_off(self.mixed)}

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        options.update(chunked_prefill_size=self.size, enable_mixed_chunk=self.mixed)
