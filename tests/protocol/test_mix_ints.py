"""``synth.mix_ints``: the prompt's tokens come from the mix of host ints without a tensor.
The oracle is the mix's definition, step by step in Python's unbounded ints."""

from __future__ import annotations

import random

import pytest

from overlap_harness.model.protocol.synth import MOD, VOCAB, mix_ints, prompt_token


def definition(*xs: int) -> int:
    h = 17
    for x in xs:
        h = (h * 7919 + (x % MOD) * 104729 + 12345) % MOD
    return h


@pytest.mark.parametrize("seed", range(20))
def test_mix_of_ints_is_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        xs = [rng.choice([rng.randrange(-2**63, 2**63), rng.randrange(-10, 10**7), MOD - 1])
              for _ in range(rng.randint(0, 9))]
        assert mix_ints(*xs) == definition(*xs)


def test_prompt_tokens_are_vocabulary_ids_from_the_seed_and_position() -> None:
    assert [prompt_token(5, p) for p in range(4)] == [definition(5, p, 11) % VOCAB
                                                      for p in range(4)]
    assert prompt_token(5, 0) != prompt_token(6, 0)
