"""The fake worker of an embedding model: ``forward_batch_embedding`` as one declared op on
the forward stream (the feature: :mod:`..features.embedding`).

:class:`FakeEmbeddingWorker`'s forward declares the real forward's KV writes and attention
reads, as :mod:`.model_worker` declares them, and the pooled embedding of each request
written to a fresh tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.sglang.stand_ins import eagle_models, model_worker
from overlap_harness.recorder.kernels import DeclaredAccess, declared, writes

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
    eagle_models.fill_slots(fake.kv_buffer, batch.out_cache_loc, 1.0)  # set_kv_buffer
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
