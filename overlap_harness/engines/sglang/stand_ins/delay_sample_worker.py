"""The fake worker of delayed sampling: TpModelWorker's delayed-sampling branch, its model
forward and its deferred sampler as declared ops (the feature: :mod:`..features.delay_sample`).

SGLang 0.5.23's ``TpModelWorker.forward_batch_generation`` (tp_worker.py, "Delay sampling
only for normal generation requests") returns a result without tokens and with a
``delay_sample_func`` when the overlap scheduler is on, speculative decoding off, and either
the batch has grammars or ``SGLANG_ENABLE_DELAY_SAMPLE`` is set and the batch is not
prefill-only. :class:`DelaySampleWorker` takes that branch under that condition: its
forward is one declared op writing logits (the real forward's KV writes and attention reads,
as :mod:`.model_worker` declares them), its deferred sampler one declared op reading the
logits and writing the tokens. For grammar-constrained batches the sampler first runs
SGLang's ``update_regex_vocab_mask`` and ``apply_logits_bias``
(``ModelRunner._preprocess_logits``): the bitmask filled on the host from each request's
grammar (:mod:`..features.grammar`), moved to the device with a non-blocking copy and
applied to the logits.
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.sglang.stand_ins import model_worker
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes


def _logits_accesses(out: torch.Tensor, fake: DelaySampleWorker, batch: Any
                     ) -> list[DeclaredAccess]:
    return model_worker._forward_accesses(out, fake, batch)


@declared(_logits_accesses, name="model_forward_logits")
def _forward_logits(fake: DelaySampleWorker, batch: Any) -> torch.Tensor:
    """One logit row per request (the fake model's preferred token gets 1)."""
    tokens = model_worker._model_forward.__wrapped__(fake, batch)
    logits = torch.zeros((tokens.shape[0], model_worker.VOCAB), device=batch.seq_lens.device)
    if tokens.shape[0]:
        logits.scatter_(1, tokens.view(-1, 1), 1.0)
    return logits


def _sample_accesses(out: torch.Tensor, logits: torch.Tensor) -> list[DeclaredAccess]:
    return reads(logits) + writes(out)


@declared(_sample_accesses, name="sampler")
def _sample(logits: torch.Tensor) -> torch.Tensor:
    """Greedy: each row's argmax."""
    return logits.argmax(dim=-1).to(torch.int64)


def _defers_sampling(batch: Any) -> bool:
    """TpModelWorker's condition for a delayed sample (module docstring); the overlap
    scheduler is on in every driven variant."""
    from sglang.srt.environ import envs

    if not batch.spec_algorithm.is_none():
        return False
    has_grammars = batch.sampling_info is not None and batch.sampling_info.grammars is not None
    return has_grammars or (envs.SGLANG_ENABLE_DELAY_SAMPLE.get() and not batch.is_prefill_only)


def _bind_grammars(batch: Any) -> None:
    """What the real worker's ``ForwardBatch.init_new`` does to the batch's sampling info
    before the forward (0.5.23; ``get_model_worker_batch`` in older releases): a batch with
    grammars carries each request's grammar object (``sampling_info.grammars``), else None.
    The fake worker builds no ``ForwardBatch``, so it binds them itself."""
    if batch.sampling_info is not None and getattr(batch, "has_grammar", False):
        batch.sampling_info.grammars = [req.grammar for req in batch.reqs]


def _grammar_masked(sampling_info: Any, logits: torch.Tensor) -> None:
    """What ``ModelRunner._preprocess_logits`` does before sampling, all SGLang's: the
    grammars' bitmask built on the host from their state (advanced by the previous batch's
    result processing), staged to the device, and applied to the logits."""
    sampling_info.update_regex_vocab_mask()
    sampling_info.apply_logits_bias(logits)
    sampling_info.grammar_mask = None


class DelaySampleWorker(model_worker.FakeModelWorker):
    """The fake worker with TpModelWorker's delayed-sampling branch."""

    delayed_samples = 0  # how many forwards deferred their sampling (for tests)

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        if kwargs or self.decode_graphs is not None:
            raise TypeError("DelaySampleWorker: arguments or decode graphs not planned")
        _bind_grammars(batch)
        if not _defers_sampling(batch):
            return super().forward_batch_generation(batch)
        self.forwards += 1
        logits = _forward_logits(self, batch)
        if self.graph_runner and batch.forward_mode.is_decode():
            event = torch.cuda.Event()
            event.record()
            self.model_runner.shared_read_done_event = event
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=logits),
            can_run_cuda_graph=self.graph_runner)

        # the forward's sampling info, as the real closure holds it (through its
        # ForwardBatch): run_batch gives the batch its own back before the sample runs
        sampling_info = batch.sampling_info

        def sample_batch_func() -> Any:
            logits = result.logits_output.next_token_logits
            if sampling_info.grammars is not None:
                _grammar_masked(sampling_info, logits)
            result.next_token_ids = _sample(logits)
            return result

        result.delay_sample_func = sample_batch_func
        self.delayed_samples += 1
        return result
