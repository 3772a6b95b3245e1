"""Run SGLang's own ``Scheduler.event_loop_overlap`` for one variant under the recorder.

The loop is SGLang's, unmodified; the driver replaces only ``ingest_requests`` (the ZMQ
intake: it hands the loop the variant's requests at their iterations through SGLang's own
``_add_request_to_queue``, marks the iteration for the recorder, and ends the loop after the
last one) and the server plumbing around results (:mod:`.plumbing`).
"""

from __future__ import annotations

import time
from array import array
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.engines.sglang import environment, scheduler_build
from overlap_harness.engines.sglang.features.hip import Hip
from overlap_harness.engines.sglang.stand_ins import loop_kernels
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
        greedy = self.variant.speculative is not None
        params = SamplingParams(max_new_tokens=max_new, ignore_eos=True,
                                temperature=0.0 if greedy else 1.0)
        params.normalize(None)
        ids = array("q", [(self.counter * 7 + k) % 97 + 1 for k in range(prompt_len)])
        req = Req(f"r{self.counter}", "", ids, params, vocab_size=1000)
        req.tokenizer = None
        req.logprob_start_len = -1  # what handle_generate_request sets without return_logprob
        for feature in self.variant.features:
            feature.request(req, self.variant)
        return req


def _one_of(variant: Variant, hook: str) -> Any:
    """The one answer the variant's features give to ``hook`` (None when none answers);
    two different answers are a variant whose features cannot be combined."""
    answers = {type(f).__name__: value for f in variant.features
               if (value := getattr(f, hook)(variant)) is not None}
    if len({id(value) for value in answers.values()}) > 1:
        raise ValueError(f"variant {variant.name}: features {', '.join(answers)} each give "
                         f"their own {hook}")
    return next(iter(answers.values()), None)


def _declare_kernels(variant: Variant) -> None:
    """Declare the stand-in kernels of the loop and of the variant's features, each once
    (before the watch starts: they are patched in when it does)."""
    declared: list[Any] = [loop_kernels.declare]
    for feature in variant.features:
        declared += [d for d in feature.kernels(variant) if d not in declared]
    for declare in declared:
        declare()


def server_options(variant: Variant) -> dict[str, Any]:
    """The variant's ``ServerArgs`` keyword arguments: the base ones, then each feature's."""
    options = scheduler_build.base_server_options()
    for feature in variant.features:
        feature.server_options(options, variant)
    return options


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
    _declare_kernels(variant)
    started = time.process_time()
    options = server_options(variant)
    args = scheduler_build.server_args(options)
    watching = recorder.watch(mode="cpu") if device is None else device.watch()
    with (watching as watch, environment.cuda_selected(hip=variant.has(Hip)),
          ExitStack() as switches):
        for feature in variant.features:
            if (context := feature.switches(variant)) is not None:
                switches.enter_context(context)
        scheduler = scheduler_build.build_scheduler(
            args, variant.pools, radix_cache=not options["disable_radix_cache"],
            graph_runner=all(f.fake_runner for f in variant.features),
            worker_class=_one_of(variant, "worker_class"),
            spec_workers=_one_of(variant, "spec_workers"), pools=_one_of(variant, "pools"))
        for feature in variant.features:
            feature.attach(scheduler, args, variant)
        intake = _Intake(scheduler, variant, watch)
        _intake_installed(scheduler, intake)
        # startup ends with the device idle (weights loaded, graphs captured), and
        # run_event_loop enters the loop on the schedule stream
        torch.cuda.synchronize()
        with ExitStack() as around_loop:
            for feature in variant.features:
                context = feature.loop(scheduler, variant, lambda: intake.iteration)
                if context is not None:
                    around_loop.enter_context(context)
            around_loop.enter_context(torch.cuda.stream(scheduler.schedule_stream))
            around_loop.enter_context(
                nullcontext() if device is None else device.forcing(scheduler))
            scheduler.event_loop_overlap()
        torch.cuda.synchronize()
    return LoopRun(variant.name, watch.races, intake.iteration + 1,
                   scheduler.tp_worker.forwards,
                   [u.name for u in watch.unknown_ops], time.process_time() - started, watch,
                   scheduler.tp_worker, intake.requests, scheduler)
