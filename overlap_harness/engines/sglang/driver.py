"""Run SGLang's own ``Scheduler.event_loop_overlap`` for one variant under the recorder.

The loop is SGLang's, unmodified; the driver replaces only ``ingest_requests`` (the ZMQ
intake: it hands the loop the variant's requests at their iterations through SGLang's own
``_add_request_to_queue``, marks the iteration for the recorder, and ends the loop after the
last one) and the server plumbing around results (:mod:`.plumbing`).
"""

from __future__ import annotations

import time
from array import array
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang import environment, scheduler_build
from overlap_harness.engines.sglang.features import (
    decode_graph,
    delay_sample,
    dp_attention,
    draft_extend_graph,
    dspark,
    eager_prefill,
    eagle,
    eagle_verify_graph,
    embedding,
    grammar,
    multi_layer_eagle,
    unified_memory,
)
from overlap_harness.engines.sglang.stand_ins import (
    eagle_kernels,
    graph_kernels,
    loop_kernels,
    multi_layer_eagle_models,
    unified_memory_kernels,
)
from overlap_harness.engines.sglang.variants import Variant
from overlap_harness.model.trace import Race


@dataclass
class LoopRun:
    """What one run of the loop found."""

    variant: str
    races: list[Race]
    iterations: int
    forwards: int
    unknown_ops: list[str] = field(default_factory=list)
    seconds: float = 0.0
    watch: Any = None  # the recorder's Watch, for reports
    worker: Any = None  # the fake model worker (what it ran), for tests
    requests: list[Any] = field(default_factory=list)  # SGLang's Req objects, in arrival order
    scheduler: Any = None  # the driven scheduler (its pools hold the run's final values)


class _Intake:
    """``ingest_requests`` for the driven loop: the variant's arrivals, iteration marks, and
    the end of the loop."""

    def __init__(self, scheduler: Any, variant: Variant, watch: Any) -> None:
        self.scheduler = scheduler
        self.variant = variant
        self.watch = watch
        self.iteration = -1
        self.counter = 0
        self.requests: list[Any] = []

    def __call__(self, stop_at_pause: bool = False) -> list[Any]:
        self.iteration += 1
        self.watch.iteration(self.iteration)
        for prompt_len, max_new in self.variant.arrivals.get(self.iteration, ()):
            request = self._request(prompt_len, max_new)
            self.requests.append(request)
            self.scheduler._add_request_to_queue(request)
        if self.iteration + 1 >= self.variant.iterations:
            self.scheduler.gracefully_exit = True  # the loop stops before the next one
        return []

    def _request(self, prompt_len: int, max_new: int) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.counter += 1
        # spec variants sample greedily (EAGLE's verify takes SGLang's greedy tree walk)
        greedy = self.variant.eagle is not None or self.variant.dspark is not None
        params = SamplingParams(max_new_tokens=max_new, ignore_eos=True,
                                temperature=0.0 if greedy else 1.0)
        params.normalize(None)
        ids = array("q", [(self.counter * 7 + k) % 97 + 1 for k in range(prompt_len)])
        req = Req(f"r{self.counter}", "", ids, params, vocab_size=1000)
        req.tokenizer = None
        req.logprob_start_len = -1  # what handle_generate_request sets without return_logprob
        if self.variant.grammar:
            grammar.constrain(req)
        return req


def _worker_class(variant: Variant) -> type | None:
    """The fake worker a variant needs beside the default one (None: the default)."""
    if variant.dp_peer is not None:
        return dp_attention.DPRankModelWorker
    if variant.delay_sample or (variant.grammar and variant.eagle is None):
        # TpModelWorker defers the sampling of grammar batches (without speculation)
        return delay_sample.DelaySampleWorker
    if variant.unified_memory is not None:
        return unified_memory.UnifiedMemoryWorker
    return embedding.FakeEmbeddingWorker if variant.embedding else None


def _intake_installed(scheduler: Any, intake: _Intake) -> None:
    """The variant's arrivals where the release's loop takes its input: ``ingest_requests``
    (receive and dispatch in one step), or, in releases without it, the request receiver's
    ``recv_requests`` (its empty list then dispatched by the release's own
    ``process_input_requests``)."""
    from overlap_harness.engines.core.strict import StrictStub

    if hasattr(scheduler, "ingest_requests"):
        scheduler.ingest_requests = intake
    else:
        scheduler.request_receiver = StrictStub("request_receiver", recv_requests=intake)


def run_variant(variant: Variant, device: Any = None) -> LoopRun:
    """One run of ``variant`` on the real loop; SGLang must be loaded (``environment.load``).

    ``device`` None: under ``recorder.watch(mode="cpu")``. Otherwise the run is on a real
    CUDA device and ``device`` gives its ``watch()`` (a context yielding what stands for the
    recorder's watch) and ``forcing(scheduler)`` (a context around the loop): see
    :mod:`.gpu.loop`."""
    loop_kernels.declare()
    if (variant.decode_graph_sizes or variant.eager_prefill_pre_replay
            or (variant.eagle and variant.eagle.verify_graph_sizes)):
        graph_kernels.declare()
    if variant.eagle is not None or variant.dspark is not None:
        eagle_kernels.declare()  # the spec-v2 allocation and relay kernels DSpark shares
    if variant.eagle is not None and variant.eagle.multi_layer:
        multi_layer_eagle_models.declare()
    if variant.eager_prefill_pre_replay:
        eager_prefill.declare()
    if variant.unified_memory is not None:
        unified_memory_kernels.declare()
    started = time.process_time()
    if variant.dspark is not None:
        args = dspark.server_args(variant.dspark,
                                        chunked_prefill_size=variant.chunked_prefill_size,
                                        mixed_chunk=variant.mixed_chunk,
                                        max_running_requests=variant.pools.request_rows)
    elif variant.eagle is None:
        args = scheduler_build.server_args(chunked_prefill_size=variant.chunked_prefill_size,
                                           radix_cache=variant.radix_cache,
                                           mixed_chunk=variant.mixed_chunk,
                                           dp_attention=variant.dp_peer is not None,
                                           unified_memory=variant.unified_memory is not None)
    else:
        args = (multi_layer_eagle if variant.eagle.multi_layer
                else eagle).server_args(variant.eagle,
                                       chunked_prefill_size=variant.chunked_prefill_size,
                                       mixed_chunk=variant.mixed_chunk)
    watching = recorder.watch(mode="cpu") if device is None else device.watch()
    with (watching as watch, environment.cuda_selected(hip=variant.hip),
          environment.retraction_forced(variant.retract_every),
          eagle.selected(variant.eagle, hip=variant.hip),
          dspark.selected(variant.dspark),
          delay_sample.enabled(variant.delay_sample),
          eager_prefill.fastpath_enabled(variant.eager_prefill_pre_replay
                                         or unified_memory.publishes_prefill_read_done(
                                             variant.unified_memory)),
          unified_memory.eviction_selected(variant.unified_memory)):
        scheduler = scheduler_build.build_scheduler(
            args, variant.pools, radix_cache=variant.radix_cache,
            graph_runner=variant.graph_runner,
            worker_class=_worker_class(variant), spec_workers=(
                multi_layer_eagle.workers(variant.eagle)
                or eagle.workers(variant.eagle) or dspark.workers(variant.dspark)),
            pools=unified_memory.pools(variant.unified_memory))
        if variant.embedding:
            embedding.make_embedding_scheduler(scheduler)
        if variant.unified_memory is not None:
            unified_memory.attach(scheduler, variant.unified_memory)
        if variant.decode_graph_sizes:
            decode_graph.attach(scheduler, args, variant.decode_graph_sizes,
                                post_replay=variant.graph_reads_end_post_replay,
                                pre_replay=variant.graph_reads_end_pre_replay)
        if variant.eager_prefill_pre_replay:
            eager_prefill.attach(scheduler, args)
        if variant.eagle is not None and variant.eagle.verify_graph_sizes:
            eagle_verify_graph.attach(scheduler, args, variant.eagle.verify_graph_sizes,
                               variant.eagle.num_draft_tokens, variant.eagle.topk > 1)
        if variant.eagle is not None and variant.eagle.draft_extend_graph:
            draft_extend_graph.attach(scheduler, variant.eagle.verify_graph_sizes)
        intake = _Intake(scheduler, variant, watch)
        _intake_installed(scheduler, intake)
        # startup ends with the device idle (weights loaded, graphs captured), and
        # run_event_loop enters the loop on the schedule stream
        torch.cuda.synchronize()
        with (dp_attention.peer_installed(variant.dp_peer, variant.iterations - 1,
                                     lambda: intake.iteration, scheduler),
              torch.cuda.stream(scheduler.schedule_stream),
              nullcontext() if device is None else device.forcing(scheduler)):
            scheduler.event_loop_overlap()
        torch.cuda.synchronize()
    return LoopRun(variant.name, watch.races, intake.iteration + 1,
                   scheduler.tp_worker.forwards,
                   [u.name for u in watch.unknown_ops], time.process_time() - started, watch,
                   scheduler.tp_worker, intake.requests, scheduler)
