"""Delayed sampling (``SGLANG_ENABLE_DELAY_SAMPLE``): the sampler runs after the previous
batch's result is processed, on the forward stream, launched by the scheduler.

SGLang 0.5.23's ``TpModelWorker.forward_batch_generation`` (tp_worker.py, "Delay sampling
only for normal generation requests") returns a result without tokens and with a
``delay_sample_func`` when the overlap scheduler is on, speculative decoding off, and either
the batch has grammars or ``SGLANG_ENABLE_DELAY_SAMPLE`` is set and the batch is not
prefill-only. The scheduler's ``run_batch`` then skips the relay and the result copy, and
``launch_batch_sample_if_needed`` (after ``process_batch_result`` of the previous batch)
enters the forward stream behind the schedule stream, calls the function, relays the sampled
tokens through the FutureMap and copies the result to the host: all SGLang's. The worker
taking that branch is the harness's
(:class:`~overlap_harness.engines.sglang.stand_ins.delay_sample_worker.DelaySampleWorker`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins.delay_sample_worker import DelaySampleWorker

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


@contextmanager
def enabled(on: bool) -> Iterator[None]:
    """``SGLANG_ENABLE_DELAY_SAMPLE`` set for the block when ``on``."""
    if not on:
        yield
        return
    from sglang.srt.environ import envs

    with envs.SGLANG_ENABLE_DELAY_SAMPLE.override(True):
        yield


@dataclass(frozen=True, slots=True)
class DelaySample(Feature):
    """``SGLANG_ENABLE_DELAY_SAMPLE``: every non-prefill-only forward leaves its sampling to
    the scheduler (``launch_batch_sample_if_needed``)."""

    keys: ClassVar[tuple[str, ...]] = ("delay_sample",)
    options: ClassVar[tuple[str, ...]] = ("SGLANG_ENABLE_DELAY_SAMPLE",)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"delay_sample": "on"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [rf.DELAY_SAMPLE] + ([] if variant.speculative is not None
                                    else [rf.DELAYED_SAMPLE])

    def switches(self, variant: Variant) -> AbstractContextManager[Any]:
        return enabled(True)

    def worker_class(self, variant: Variant) -> type | None:
        return DelaySampleWorker
