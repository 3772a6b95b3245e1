"""Model Runner V2's encoder-only instance (``--mm-encoder-only``, or the producer side of
encoder-cache disaggregation): steps that never wait on the device.

An encoder-only step returns a ``ModelRunnerOutput`` built on the host
(``make_empty_encoder_model_runner_output``): no D2H copy, no event, so the engine's future
resolves as soon as the host has launched the step. Nothing then bounds how far the host runs
ahead of the device, and the ``UvaBufferPool`` rings (as deep as ``max_concurrent_batches``)
would be rewritten while an earlier step's kernel still reads them. vLLM's
``MMEncoderModelRunner.input_tensor_semaphore`` (vLLM #53176) guards the host writes of
``execute_model``: entering synchronizes the event of the step that last wrote these slots,
leaving records this step's.

Driven: vLLM's own ``input_tensor_semaphore`` (on a bare ``MMEncoderModelRunner`` given the two
fields its ``__init__`` sets for it), around the block table's staged writes applied through
the UVA ring (``StagedWriteTensor``, the write kernel declared), as ``execute_model`` has
them; then the encoder's forward (a fake: torch ops reading the block-table rows) and the
host-only output, taken at once (the engine's batch queue is as deep as the ring).
"""

from __future__ import annotations

from typing import Any

import torch

from overlap_harness.engines.vllm.environment import cuda_selected, import_vllm
from overlap_harness.engines.vllm.kernels import apply_write_kernel_declared
from overlap_harness.recorder import watch

NUM_REQS, BLOCKS, HIDDEN = 3, 4, 8
STEPS_IN_FLIGHT = 2  # max_concurrent_batches under async scheduling, pipeline size 1


def _encoder_runner(runner_class: Any, depth: int) -> Any:
    """A bare ``MMEncoderModelRunner`` with the events ``__init__`` makes for the semaphore
    (one per batch in flight, blocking)."""
    runner = runner_class.__new__(runner_class)
    runner._input_events = [torch.Event(blocking=True) for _ in range(depth)]
    runner._input_event_idx = 0
    return runner


def encoder_only_steps(steps: int = 5, guarded: bool = True,
                       depth: int = STEPS_IN_FLIGHT, semaphore: Any = None) -> Any:
    """Encoder-only steps, each staging new block-table rows for its requests and applying
    them through the UVA ring of ``depth`` slots, then encoding (the fake forward reads the
    rows); the host never waits on the device. ``guarded``: inside vLLM's
    ``input_tensor_semaphore`` (as released); False runs the same writes outside it (the
    runner before the semaphore); ``semaphore``: an ``input_tensor_semaphore`` function to
    run in place of the loaded tree's (one release's). Returns the watch with ``w.outputs``
    the encodings' host-side ids."""
    import_vllm()
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.mm_encoder_model_runner import (  # imported on the host platform
        MMEncoderModelRunner,
    )

    with (watch("cpu") as w, cuda_selected(w), apply_write_kernel_declared(buffer_utils)):
        device = torch.device("cuda")
        runner_class = MMEncoderModelRunner if semaphore is None else type(
            "MMEncoderModelRunnerAt", (MMEncoderModelRunner,),
            {"input_tensor_semaphore": semaphore})
        runner = _encoder_runner(runner_class, depth)
        block_table = buffer_utils.StagedWriteTensor((NUM_REQS, BLOCKS), torch.int32, device,
                                                     max_concurrency=depth)
        encoder_cache = torch.zeros(steps, NUM_REQS, HIDDEN, device=device)
        weights = torch.arange(HIDDEN, dtype=torch.float32, device=device)
        outputs = []
        for step in range(steps):
            w.iteration(step)
            guard = runner.input_tensor_semaphore() if guarded else _unguarded()
            with guard:
                for req in range(NUM_REQS):  # this step's requests and their blocks
                    block_table.stage_write(req, 0, [step * NUM_REQS + req, step])
                block_table.apply_write()
            rows = block_table.gpu[:, :1].float()  # the encoder reads its inputs
            encoder_cache[step] = rows * weights  # published embeddings
            outputs.append([f"req{r}" for r in range(NUM_REQS)])  # host-only output
    w.outputs = outputs
    return w


class _unguarded:
    """No guard: the host writes of a runner without ``input_tensor_semaphore``."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def without_semaphore() -> Any:
    """The same steps with the writes outside the semaphore (races: the ring's WAR)."""
    return encoder_only_steps(guarded=False)
