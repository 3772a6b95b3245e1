"""An embedding model's scheduler: SGLang's own overlap loop on its embedding branch.

``Scheduler.__init__`` sets ``is_generation`` from the model config (``False`` for an
embedding or reward model), and the overlap loop then takes its embedding branches, on CUDA
as on any device: ``run_batch`` enters the forward stream behind the schedule stream
(scheduler.py ``forward_stream.wait_stream(self.schedule_stream)``), calls the worker's
``forward_batch_embedding`` and SGLang's ``EmbeddingBatchResult.copy_to_cpu`` (the pooled
embeddings copied to pinned host memory, ``copy_done`` recorded); the result processor's
embedding branch waits on ``copy_done`` before reading them.

What stands in is the model:
:class:`~overlap_harness.engines.sglang.stand_ins.embedding_worker.FakeEmbeddingWorker`, the
fake worker whose ``forward_batch_embedding`` is one declared op on the forward stream.
Requests carry no new tokens to generate
(``max_new_tokens=0``): an embedding request finishes at its prefill, as SGLang's embedding
requests do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins.embedding_worker import FakeEmbeddingWorker

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.variants import Variant


def make_embedding_scheduler(scheduler: Any) -> None:
    """Turn a scheduler built for a generation model into an embedding model's: the
    ``is_generation`` that ``Scheduler.__init__`` reads from the model config, and the batch
    result processor, which SGLang's ``init_batch_result_processor`` builds with it."""
    scheduler.is_generation = False
    scheduler.init_batch_result_processor()


@dataclass(frozen=True, slots=True)
class Embedding(Feature):
    """An embedding model (``is_generation`` False): ``run_batch``'s embedding branch and the
    prefill result processor's."""

    keys: ClassVar[tuple[str, ...]] = ("model",)
    options: ClassVar[tuple[str, ...]] = ("an embedding model (--is-embedding)",)
    fake_runner: ClassVar[bool] = False

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"model": "embedding"}

    def worker_class(self, variant: Variant) -> type | None:
        return FakeEmbeddingWorker

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        make_embedding_scheduler(scheduler)
