"""Model Runner V2's encoder-only steps never wait on the device; vLLM's
``MMEncoderModelRunner.input_tensor_semaphore`` (#53176) is what keeps the host from
rewriting a UVA ring slot an earlier step's kernel still reads. Race-free as released; the
same writes outside the semaphore race (WAR: the write kernel's read of the ring vs the host
rewrite two steps later), even with a deeper ring (later). Skipped without vLLM, or on a
tree without the encoder-only runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlap_harness.engines.vllm.environment import VllmUnavailable, import_vllm

try:
    import_vllm()
except VllmUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

from overlap_harness.engines.vllm.release_features import not_applicable_reason

if (reason := not_applicable_reason("mrv2-encoder-only")) is not None:
    pytest.skip(reason, allow_module_level=True)

from overlap_harness.engines.vllm.encoder_only import encoder_only_steps


def _lines(watcher) -> set[tuple[str, str, str]]:
    def text(source: str) -> str:
        file, _, line = source.rpartition(":")
        return Path(file).read_text().splitlines()[int(line) - 1].strip()
    return {(str(r.kind), text(r.first.source), text(r.second.source)) for r in watcher.races}


def test_encoder_only_steps_are_race_free_as_released() -> None:
    watcher = encoder_only_steps()
    assert watcher.races == [] and watcher.unknown_ops == []
    assert len(watcher.outputs) == 5


@pytest.mark.parametrize("depth", [2, 3])
def test_without_the_semaphore_the_ring_is_rewritten_under_the_kernel(depth: int) -> None:
    watcher = encoder_only_steps(guarded=False, depth=depth)
    kinds = {kind for kind, _, _ in _lines(watcher)}
    assert kinds == {"WAR"}
    firsts = {first for _, first, _ in _lines(watcher)}
    seconds = {second for _, _, second in _lines(watcher)}
    assert all(line.startswith("_apply_write_kernel[") for line in firsts), firsts
    assert "dst[:n] = x" in seconds, seconds  # UvaBufferPool.copy_to_uva's host write
    assert min(r.second.iteration for r in watcher.races) == depth  # the slot's next use
