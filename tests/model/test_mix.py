"""``synth.mix`` folds its chain of steps into one affine map (one reduction and one
multiply-add per tensor); its values must be those of the definition, one reduction per step.
The oracle here is that definition in Python's unbounded ints, element by element (no torch
arithmetic), over int64 extremes, negatives, floats, 0-dim tensors, Python ints in every
position and broadcast shapes."""

from __future__ import annotations

import random

import pytest
import torch

from overlap_harness.model.protocol.synth import MOD, mix

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def reference(args: list[torch.Tensor | int]) -> list | int:
    """The definition: per element, ``h = (h * 7919 + (x mod MOD) * 104729 + 12345) mod MOD``
    from ``h = 17``, in Python ints, with a float truncated toward zero as int64 conversion
    does. Returns nested lists in the broadcast shape (an int for all-int arguments)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    shape = torch.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()
    columns = [a.expand(shape).reshape(-1).tolist() if isinstance(a, torch.Tensor)
               else [a] * max(1, _numel(shape)) for a in args]
    flat = []
    for values in zip(*columns, strict=True):
        h = 17
        for v in values:
            h = (h * 7919 + (int(v) % MOD) * 104729 + 12345) % MOD
        flat.append(h)
    return _nest(flat, list(shape)) if shape else flat[0]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _nest(flat: list[int], shape: list[int]) -> list:
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0]
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _random_arg(rng: random.Random, shape: tuple[int, ...]) -> torch.Tensor | int:
    kind = rng.choice(["int", "int64", "extreme", "float", "scalar"])
    numel = _numel(shape)
    if kind == "int":
        return rng.choice([rng.randrange(-10**6, 10**6), rng.randrange(INT64_MIN, INT64_MAX)])
    if kind == "float":
        return torch.tensor([rng.uniform(-1e9, 1e9) for _ in range(numel)],
                            dtype=torch.float32).reshape(shape)
    if kind == "scalar":
        return torch.tensor(rng.randrange(INT64_MIN, INT64_MAX), dtype=torch.int64)
    low, high = (INT64_MAX - 10, INT64_MAX) if kind == "extreme" else (-MOD * 5, MOD * 5)
    values = [rng.choice([rng.randint(low, high), INT64_MIN, -7777, MOD - 1, 0])
              for _ in range(numel)]
    return torch.tensor(values, dtype=torch.int64).reshape(shape)


@pytest.mark.parametrize("seed", range(40))
def test_mix_equals_the_definition_with_a_reduction_per_step(seed: int) -> None:
    rng = random.Random(seed)
    args = [_random_arg(rng, rng.choice([(3,), (2, 3), (2, 1), (1, 3), ()]))
            for _ in range(rng.randint(1, 8))]
    try:
        torch.broadcast_shapes(*[a.shape for a in args if isinstance(a, torch.Tensor)])
    except RuntimeError:
        args = [a if not isinstance(a, torch.Tensor) else a.reshape(-1)[:1] for a in args]
    got = mix(*args)
    assert got.dtype == torch.int64
    assert got.tolist() == reference(args)


def test_mix_of_ints_only_is_a_cpu_scalar() -> None:
    got = mix(3, 2**62, -5)
    assert got.shape == () and got.device.type == "cpu" and int(got) == reference([3, 2**62, -5])


def test_many_tensor_steps_of_the_largest_residue_stay_exact() -> None:
    # eight tensor steps of MOD - 1 (the largest x mod MOD), and int64 extremes beside it:
    # a fourth unreduced step would wrap past 2**63
    x = torch.tensor([MOD - 1, INT64_MAX, INT64_MIN, 2 * MOD - 1], dtype=torch.int64)
    args = [x] * 8
    assert mix(*args).tolist() == reference(args)
    assert all(0 <= v < MOD for v in mix(*args).tolist())
