"""Grammar-constrained requests on SGLang's own grammar path (spec v2 overlap).

What runs as SGLang's: the scheduler's grammar barrier (``_advance_pending_grammar``, handed
to the EAGLE verify as ``grammar_barrier``), ``BatchResultProcessor.advance_grammar_fsm``
(its ``copy_done.synchronize()`` before it reads the previous batch's tokens on the host),
``GrammarTree.from_device`` / ``resolve`` (the verify tree copied to the host behind an
event), ``build_grammar_vocab_mask`` / ``generate_token_bitmask`` / ``traverse_tree`` (the
bitmask over the tree, staged to the device with a non-blocking copy), ``GrammarMask.apply``
in ``eagle_sample``, and the result processors' prefill and decode grammar advance.

What stands in: the grammar object a request carries (``req.grammar``, what SGLang's grammar
manager hands a request once its grammar is compiled: xgrammar's matcher needs a tokenizer).
:class:`BannedTokenGrammar` is a :class:`BaseGrammarObject` (its unplanned methods raise, as
the base class's do): it accepts every token but one, never terminates, allocates its bitmask
pinned (as SGLang's xgrammar backend does where pinning exists), and applies it with one
declared device op (reads the mask, rewrites the logits), where xgrammar's Triton kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from overlap_harness.engines.sglang import release_features as rf
from overlap_harness.engines.sglang.features.api import Feature
from overlap_harness.engines.sglang.stand_ins.delay_sample_worker import DelaySampleWorker
from overlap_harness.recorder.kernels import DeclaredAccess, declared, reads, writes

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant

BANNED_TOKEN = 0  # the fake models sample ids 1..97: the constraint never changes a token


def _apply_accesses(out: Any, logits: torch.Tensor, vocab_mask: torch.Tensor
                    ) -> list[DeclaredAccess]:
    return reads(vocab_mask) + reads(logits) + writes(logits)


@declared(_apply_accesses, name="apply_token_bitmask_inplace")
def _apply_bitmask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
    """Logits of tokens whose bit is clear become -inf (xgrammar's in-place apply)."""
    vocab = logits.shape[-1]
    bits = torch.arange(vocab, device=logits.device)
    words = vocab_mask[..., bits // 32].to(torch.int64)
    allowed = ((words >> (bits % 32)) & 1).bool()
    if allowed.shape[0] != logits.shape[0]:
        raise ValueError(f"vocab mask rows {allowed.shape[0]} != logits rows {logits.shape[0]}")
    logits.masked_fill_(~allowed, float("-inf"))


def grammar_object_class() -> type:
    """:class:`BannedTokenGrammar`, made on SGLang's ``BaseGrammarObject`` (imported late:
    SGLang loads only inside ``environment.load``)."""
    global _GRAMMAR_CLASS
    if _GRAMMAR_CLASS is None:
        _GRAMMAR_CLASS = _make_class()
    return _GRAMMAR_CLASS


_GRAMMAR_CLASS: type | None = None


def _make_class() -> type:
    from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject

    class BannedTokenGrammar(BaseGrammarObject):
        """Every token but :data:`BANNED_TOKEN`; the accepted tokens kept for tests."""

        def __init__(self) -> None:
            super().__init__()
            self.accepted_tokens: list[int] = []

        def accept_token(self, token: int) -> None:
            if token == BANNED_TOKEN:
                raise ValueError(f"token {token} is banned by the grammar")
            self.accepted_tokens.append(int(token))

        def rollback(self, k: int) -> None:
            if k > len(self.accepted_tokens):
                raise ValueError(f"rollback of {k} past {len(self.accepted_tokens)} tokens")
            del self.accepted_tokens[len(self.accepted_tokens) - k:]

        def is_terminated(self) -> bool:
            return False

        def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any
                                ) -> torch.Tensor:
            words = (vocab_size + 31) // 32
            return torch.full((batch_size, words), -1, dtype=torch.int32, pin_memory=True)

        def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
            vocab_mask[idx].fill_(-1)
            word, bit = divmod(BANNED_TOKEN, 32)
            vocab_mask[idx, word] = int(vocab_mask[idx, word]) & ~(1 << bit)

        @staticmethod
        def move_vocab_mask(vocab_mask: torch.Tensor, device: Any) -> torch.Tensor:
            return vocab_mask.to(device, non_blocking=True)

        @staticmethod
        def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
            _apply_bitmask(logits, vocab_mask)

    return BannedTokenGrammar


def constrain(req: Any) -> None:
    """Give ``req`` a compiled grammar, as SGLang's grammar manager does before it queues the
    request."""
    req.grammar = grammar_object_class()()


@dataclass(frozen=True, slots=True)
class Grammar(Feature):
    """Every request grammar-constrained (SGLang's grammar path with a compiled grammar per
    request): with a speculative worker, its verify's grammar barrier; without one, the
    worker defers sampling (TpModelWorker's grammar branch) to the scheduler."""

    keys: ClassVar[tuple[str, ...]] = ("grammar",)
    options: ClassVar[tuple[str, ...]] = ("a request's json_schema / regex / ebnf",)

    def configuration(self, variant: Variant) -> dict[str, str]:
        return {"grammar": "on"}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        return [] if variant.speculative is not None else [rf.DELAYED_SAMPLE]

    def worker_class(self, variant: Variant) -> type | None:
        # TpModelWorker defers the sampling of grammar batches (without speculation)
        return None if variant.speculative is not None else DelaySampleWorker

    def request(self, request: Any, variant: Variant) -> None:
        constrain(request)
