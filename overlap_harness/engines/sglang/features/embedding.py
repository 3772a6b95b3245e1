"""An embedding model's scheduler: SGLang's own overlap loop on its embedding branch.

``Scheduler.__init__`` sets ``is_generation`` from the model config (``False`` for an
embedding or reward model), and the overlap loop then takes its embedding branches, on CUDA
as on any device: ``run_batch`` enters the forward stream behind the schedule stream
(scheduler.py ``forward_stream.wait_stream(self.schedule_stream)``), calls the worker's
``forward_batch_embedding`` and SGLang's ``EmbeddingBatchResult.copy_to_cpu`` (the pooled
embeddings copied to pinned host memory, ``copy_done`` recorded); the result processor's
embedding branch waits on ``copy_done`` before reading them.

What stands in is the model: :class:`FakeEmbeddingWorker` is the fake worker whose
``forward_batch_embedding`` is one declared op on the forward stream (the real forward's
KV writes and attention reads, as :mod:`.stand_ins.model_worker` declares them, and the pooled
embedding of each request written to a fresh tensor). Requests carry no new tokens to generate
(``max_new_tokens=0``): an embedding request finishes at its prefill, as SGLang's embedding
requests do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins import model_worker
from overlap_harness.recorder.kernels import DeclaredAccess, declared, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.variants import Variant

EMBEDDING_WIDTH = 4


def _embedding_accesses(out: torch.Tensor, fake: FakeEmbeddingWorker, batch: Any
                        ) -> list[DeclaredAccess]:
    # the forward's own reads and writes, then the pooled output in place of the tokens
    return model_worker._forward_accesses(out, fake, batch)[:-1] + writes(out)


@declared(_embedding_accesses, name="embedding_forward")
def _embedding_forward(fake: FakeEmbeddingWorker, batch: Any) -> torch.Tensor:
    """One pooled vector per request: a function of the KV the forward reads (device work
    only, as a real forward launches)."""
    req_to_token = fake.req_to_token_pool.req_to_token
    fake.kv_buffer[batch.out_cache_loc] = 1.0  # set_kv_buffer
    rows = [fake.kv_buffer[req_to_token[row, :seq_len].to(torch.int64)].sum() + seq_len
            for row, seq_len in model_worker._rows_and_lengths(batch)]
    if not rows:
        return torch.zeros((0, EMBEDDING_WIDTH), device=batch.seq_lens.device)
    return torch.stack(rows).view(-1, 1).expand(-1, EMBEDDING_WIDTH).contiguous()


class FakeEmbeddingWorker(model_worker.FakeModelWorker):
    """The fake worker of an embedding model: ``forward_batch_embedding`` only."""

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        raise TypeError("forward_batch_generation: an embedding model never generates")

    def forward_batch_embedding(self, batch: Any) -> tuple[Any, bool]:
        """SGLang's ``EmbeddingPoolerOutput`` of ``batch`` and whether a graph ran (never:
        the extend forward of an embedding model runs eager)."""
        from sglang.srt.layers.pooler import EmbeddingPoolerOutput

        self.forwards += 1
        return EmbeddingPoolerOutput(embeddings=_embedding_forward(self, batch)), False


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
