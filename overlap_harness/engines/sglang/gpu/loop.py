"""SGLang's own overlap loop on a real CUDA device, a race forced by delaying one stream.

The same driven loop as CPU mode (:func:`.driver.run_variant`: SGLang's scheduler, FutureMap,
result processor, EAGLE v2 worker, graph runners) runs on real streams, events, pinned memory
and graphs. The recorder does not run; the declared stand-ins (:mod:`.stand_ins.loop_kernels`,
:mod:`.stand_ins.eagle_kernels`, :mod:`.stand_ins.graph_kernels`, ...) are routed to their torch
implementations (``cpu_impl``), which here run on the device, so the values are the ones CPU mode
computes.

Forcing, as gpu_check does for scenarios (without importing it): a torch dispatch mode puts
``torch.cuda._sleep(cycles)`` on the current stream before every device op issued while one of
the named streams is current, so that stream's work lands late and whatever is not ordered
after it runs first. The *serial* answer is the same loop with the device synchronized after
every device op (nothing can overlap, so no race can show); a trial is wrong when what it left
in SGLang's own buffers differs from it: each request's ``output_ids`` and the final
``req_to_token`` table (the KV slots of every row).
"""

from __future__ import annotations

import gc
import os
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from overlap_harness.model.node_rows import collector_paused
from overlap_harness.recorder.kernels import installed


class _DeviceWatch:
    """What stands for the recorder's watch in a device run: iteration marks go nowhere,
    nothing is recorded."""

    def __init__(self) -> None:
        self.races: list[Any] = []
        self.unknown_ops: list[Any] = []

    def iteration(self, index: int) -> None:
        """The driver marks each iteration; a device run keeps no timeline."""


#: the environment variable ``--gpu-kernels`` sets for the children (``sglang``/``stand_in``)
KERNELS_VARIABLE = "OVERLAP_HARNESS_GPU_KERNELS"


class _StandInSink:
    """A kernel sink of a device run; it records nothing. Which implementation runs for a
    declared SGLang kernel (``kernels``): ``"sglang"`` (default), SGLang's own kernel (its
    Triton kernel compiled for the device: no host synchronisation the real server does not
    make), except where it reaches a compiled ``sgl_kernel`` op this host lacks (the strict
    stand-in raises :class:`UnplannedUseError` at the call, before anything is launched):
    then, for that kernel and the rest of the run, the harness's torch implementation
    (``cpu_impl``), named in :attr:`stood_in`; ``"stand_in"``: the torch implementations
    throughout (the mode before 2026-12-07: their Python loops read index values on the
    host, each read a host synchronisation SGLang's kernel does not make, which can order
    the very sides a trial means to race)."""

    cpu_mode = True

    def __init__(self, kernels: str = "sglang") -> None:
        self.kernels = kernels
        self.stood_in: set[str] = set()
        #: calls of each declared kernel, ``NAME (declined)`` where it answered False without
        #: launching (SGLang's ``try_small_copy`` declines tensors its kernel cannot take):
        #: which path the device took where the CPU mode's race names a kernel's line
        self.calls: Counter[str] = Counter()
        #: the trial's forcing mode while the loop runs (:meth:`DeviceRun.forcing`): SGLang's
        #: own kernel is a Triton launch, which no dispatch mode sees, so it is handed to the
        #: mode as one device op (delayed, probed, snapshotted, synchronized in a serial run)
        self.mode: Any = None

    def implementation(self, declaration: Any, original: Any) -> Any:
        """What runs for ``declaration`` (see the class)."""
        stand_in = declaration.cpu_impl
        if stand_in is None or self.kernels == "stand_in" or declaration.name in self.stood_in:
            return stand_in or original

        def run(*args: Any, **kwargs: Any) -> Any:
            from overlap_harness.engines.core.strict import UnplannedUseError

            try:
                out = original(*args, **kwargs) if self.mode is None else \
                    self.mode.kernel(original, args, kwargs)
            except UnplannedUseError:  # a compiled sgl_kernel op this host does not have
                self.stood_in.add(declaration.name)
                return stand_in(*args, **kwargs)
            self.calls[declaration.name + (" (declined)" if out is False else "")] += 1
            return out
        return run

    def quiet(self) -> Any:
        """Nothing is recorded anyway."""
        return nullcontext()

    def record_declared(self, name: str, accesses: Any, rerun: Any = None) -> None:
        """A device run records no ops."""


def _on_device(args: Any, kwargs: Any) -> bool:
    """A device op: a CUDA tensor among its arguments, or a CUDA device asked for (a
    host-to-device copy, ``cpu_tensor.to("cuda", non_blocking=True)``, has only the latter)."""
    return any((isinstance(x, torch.Tensor) and x.device.type == "cuda")
               or (isinstance(x, torch.device) and x.type == "cuda")
               for x in tree_leaves((args, kwargs)))


class _Forced(TorchDispatchMode):
    """Before each device op issued on a delayed stream, ``torch.cuda._sleep(cycles)`` on it
    (``targeted``: only before the ops the probe says come from the race's earlier side);
    with ``serial``, a device synchronize after each device op. Nothing is added inside a
    graph capture (a synchronize is illegal there, and a sleep would be replayed)."""

    def __init__(self, delayed: set[int], cycles: int, serial: bool, probe: Any = None,
                 targeted: bool = False, capture: Any = None) -> None:
        super().__init__()
        self.probe = probe  # a gpu_probe.SideProbe told of each delayed op, or None
        self.capture = capture  # an access_values.AccessCapture of the sides' ops, or None
        self.delayed = delayed
        self.cycles = cycles
        self.serial = serial
        self.targeted = targeted and probe is not None
        self.sleeps = 0
        self._in_kernel = False  # inside a declared kernel handed over whole (:meth:`kernel`)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        if self._in_kernel:  # part of a declared kernel, held and synchronized as one op
            return func(*args, **kwargs)
        device = _on_device(args, kwargs) and not torch.cuda.is_current_stream_capturing()
        return self.launch(func, args, kwargs, device)

    def kernel(self, function: Any, args: Any, kwargs: Any) -> Any:
        """A declared SGLang kernel (a Triton launch, or a function of torch ops and
        launches) as one device op: delayed before it, probed and synchronized after it as
        :meth:`launch` does, its snapshot (access values) what it returned or, for a launch
        that returns none, the tensors it was given (it writes into them)."""
        device = _on_device(args, kwargs) and not torch.cuda.is_current_stream_capturing()
        self._in_kernel = True
        try:
            out = self.launch(function, args, kwargs, device, snapshot=False)
        finally:
            self._in_kernel = False
        if device and self.capture is not None:
            location = self.capture.location()
            if location is not None:
                given = [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]
                self.capture.capture(location, given or (args, kwargs))
        return out

    def launch(self, func: Any, args: Any, kwargs: Any, device: bool,
               snapshot: bool = True) -> Any:
        """``func(*args, **kwargs)``, delayed before (a delayed current stream; targeted:
        an op of the earlier side there), told to the probe after, synchronized after in a
        serial run."""
        on_delayed = device and bool(self.delayed) and \
            torch.cuda.current_stream().cuda_stream in self.delayed
        # targeted: an op from the earlier side's line is on the earlier side's stream by
        # definition, whichever stream object the loop's attributes hold (a stream made per
        # call, a context's own), so it is held wherever it is issued
        watched = self.probe is not None and (on_delayed or (device and self.targeted))
        earlier = watched and self.probe.at_earlier(3)
        held = earlier if self.targeted else on_delayed
        if held:
            torch.cuda._sleep(self.cycles)
            self.sleeps += 1
        out = func(*args, **kwargs)
        if watched:
            self.probe.after_op(earlier)
        if device and snapshot and self.capture is not None:
            location = self.capture.location()
            if location is not None:
                self.capture.capture(location, out)
        if device and self.serial:
            torch.cuda.synchronize()
        return out

    @contextmanager
    def replays(self) -> Iterator[None]:
        """A CUDA graph's replay is no dispatched op: ``CUDAGraph.replay`` is wrapped so that
        a replay on a delayed stream is delayed (and synchronized after in a serial run) too."""
        graph_class = torch.cuda.CUDAGraph
        original = graph_class.replay

        def replay(graph: Any) -> Any:
            capturing = torch.cuda.is_current_stream_capturing()
            return self.launch(original, (graph,), {}, not capturing)

        try:
            graph_class.replay = replay
        except TypeError:  # a torch whose CUDAGraph is the extension type: replays unforced
            yield
            return
        try:
            yield
        finally:
            graph_class.replay = original


def loop_streams(scheduler: Any, depth: int = 3) -> dict[str, torch.cuda.Stream]:
    """The CUDA streams the loop's objects hold, by attribute name (``forward_stream``,
    ``copy_stream``, ``schedule_stream``, FutureMap's ``fwd_prepare_d2h_stream``, the EAGLE
    worker's ``plan_stream``): a walk of the scheduler's attributes, ``depth`` levels down."""
    found: dict[str, torch.cuda.Stream] = {}
    seen: set[int] = set()
    frontier = [scheduler]
    for _ in range(depth):
        following = []
        for holder in frontier:
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            try:
                fields = vars(holder)
            except TypeError:
                continue
            for name, value in fields.items():
                if isinstance(value, torch.cuda.Stream):
                    found.setdefault(name, value)
                elif not isinstance(value, (torch.Tensor, str, bytes, int, float, list, dict,
                                            tuple, set, type)) and hasattr(value, "__dict__"):
                    following.append(value)
        frontier = following
    return found


@dataclass(frozen=True, slots=True)
class Forcing:
    """How a trial is run: the streams delayed (attribute names), by how many cycles before
    each device op; ``serial`` for the serial answer."""

    streams: tuple[str, ...] = ()
    cycles: int = 0
    serial: bool = False
    #: delay only the race's earlier side (its ops on the stream, or the host's calls at its
    #: line for ``host``), found by the trial's probe; else every op of the streams
    targeted: bool = False

    def label(self) -> str:
        """E.g. ``copy_stream+1048576cy``, ``copy_stream@earlier+1048576cy``, ``none``,
        ``serial``."""
        if self.serial:
            return "serial"
        if not self.streams:
            return "none"
        return "+".join(self.streams) + ("@earlier" if self.targeted else "") \
            + f"+{self.cycles}cy"


def parse_label(label: str) -> tuple[str, bool, int] | None:
    """:meth:`Forcing.label` read back: ``'forward_stream@earlier+8388608cy+probe'`` ->
    (``'forward_stream'``, targeted, cycles); None for a label without a delay (``none``,
    ``serial``)."""
    stream, _, rest = label.removesuffix("+probe").partition("+")
    if not stream or not rest.endswith("cy") or not rest[:-2].isdigit():
        return None
    return stream.removesuffix("@earlier"), stream.endswith("@earlier"), int(rest[:-2])


@dataclass
class DeviceRun:
    """The ``device`` argument of :func:`.driver.run_variant` for one trial under ``plan``."""

    plan: Forcing
    probe: Any = None  # a gpu_probe.SideProbe on the delayed stream, or None
    streams_seen: list[str] = field(default_factory=list)
    sleeps: int = 0
    kernels: str = field(default_factory=lambda: os.environ.get(KERNELS_VARIABLE, "sglang"))
    stand_in_kernels: list[str] = field(default_factory=list)
    declared_kernel_calls: dict[str, int] = field(default_factory=dict)
    capture: Any = None  # an access_values.AccessCapture, or None
    _sink: Any = field(default=None, repr=False)  # the kernel sink while the run watches

    @contextmanager
    def watch(self) -> Iterator[_DeviceWatch]:
        """The declared kernels routed as :class:`_StandInSink` says (``kernels``)."""
        sink = self._sink = _StandInSink(self.kernels)
        try:
            with installed(sink):
                yield _DeviceWatch()
        finally:
            self.stand_in_kernels = sorted(sink.stood_in)
            self.declared_kernel_calls = dict(sorted(sink.calls.items()))

    @contextmanager
    def forcing(self, scheduler: Any) -> Iterator[None]:
        """The dispatch mode of :attr:`plan` around the loop."""
        streams = loop_streams(scheduler)
        self.streams_seen = sorted(streams)
        device_streams = [s for s in self.plan.streams if s != "host" and (
            s in streams or not self.plan.targeted)]  # targeted: held where issued (above)
        missing = [s for s in device_streams if s not in streams]
        if missing:
            raise KeyError(f"streams {missing} not found; the loop holds {sorted(streams)}")
        delayed = {streams[s].cuda_stream for s in device_streams}
        if "host" in self.plan.streams and self.probe is not None:
            self.probe.host_cycles = self.plan.cycles  # the host held at its earlier side
        mode = _Forced(delayed, self.plan.cycles, self.plan.serial, self.probe,
                       self.plan.targeted, self.capture)
        sink = self._sink
        try:
            if sink is not None:
                sink.mode = mode  # SGLang's own kernels go through the mode as device ops
            with mode, mode.replays(), \
                    (self.probe.watching() if self.probe is not None else nullcontext()):
                yield
        finally:  # a crashed trial keeps what it held too
            if sink is not None:
                sink.mode = None
            self.sleeps = mode.sleeps + (self.probe.host_sleeps if self.probe else 0)


#: the request's own record of speculative decoding that SGLang keeps and reports (its
#: ``meta_info`` and metrics): verify passes, accepted drafts, the acceptance histogram, in
#: the attributes the tree's ``Req`` has
ACCEPTANCE_FIELDS = ("spec_verify_ct", "spec_num_correct_drafts",
                     "spec_correct_drafts_histogram")
#: the key prefix of those values, compared apart from the output (:attr:`Trial.acceptance_wrong`)
ACCEPTANCE = "acceptance."


def observe(loop_run: Any) -> dict[str, Any]:
    """What the run left in SGLang's own buffers: each request's ``output_ids`` and the
    ``req_to_token`` table (read after a device synchronize); and, under ``acceptance.RID``,
    each request's record of its speculative decoding (:data:`ACCEPTANCE_FIELDS`): a race that
    corrupts a draft leaves the output right (the target verifies every draft) and shows as
    fewer accepted drafts, more verify passes: the throughput drop SGLang's users see."""
    torch.cuda.synchronize()
    values: dict[str, Any] = {}
    for request in loop_run.requests:
        values[f"{request.rid}.output_ids"] = [int(t) for t in request.output_ids]
    table = loop_run.scheduler.req_to_token_pool.req_to_token
    values["req_to_token"] = table.cpu().tolist()
    for request in loop_run.requests:
        record = {name: getattr(request, name) for name in ACCEPTANCE_FIELDS
                  if hasattr(request, name)}
        if record.get("spec_verify_ct"):
            values[f"{ACCEPTANCE}{request.rid}"] = {
                name: list(value) if isinstance(value, list) else int(value)
                for name, value in record.items()}
    return values


def first_difference(observed: dict[str, Any], serial: dict[str, Any]) -> str | None:
    """The first value that differs from the serial answer, as text; None when equal."""
    for key, want in serial.items():
        got = observed.get(key)
        if got == want:
            continue
        if isinstance(want, list) and isinstance(got, list):
            for index, (a, b) in enumerate(zip(got, want, strict=False)):
                if a != b:
                    if isinstance(a, list):
                        col = next(i for i, (x, y) in enumerate(zip(a, b, strict=False))
                                   if x != y) if len(a) == len(b) else 0
                        return f"{key}[{index}][{col}] = {a[col]} (serial {b[col]})"
                    return f"{key}[{index}] = {a} (serial {b})"
            return f"{key}: {len(got)} values (serial {len(want)})"
        return f"{key} = {got!r} (serial {want!r})"
    return None


@dataclass
class Trial:
    """One run of a variant under one forcing."""

    forcing: str
    wrong: str | None = None  # the first differing value
    error: str | None = None  # a crash of the run
    seconds: float = 0.0
    sleeps: int = 0
    probe: dict[str, Any] | None = None  # what a gpu_probe.SideProbe counted
    #: SGLang kernels the run took the harness's torch implementation for (_StandInSink)
    stand_in_kernels: list[str] = field(default_factory=list)
    #: the first value at a race side's own op that differs from the serial run's
    #: (access_values), where output_ids and req_to_token may not show it
    access_wrong: str | None = None
    #: the first value of the requests' acceptance record (:func:`observe`) that differs
    #: from the serial run's
    acceptance_wrong: str | None = None
    #: calls of each declared SGLang kernel in the run (_StandInSink.calls); None in trials
    #: of runs before it was kept (not known)
    declared_kernel_calls: dict[str, int] | None = None
    #: the trial started from dirtied caches (access_values.dirty_caches): memory it read
    #: before writing held a pattern, not an earlier run's values; False in trials of runs
    #: before forced trials dirtied them (2026-12-07, fifth session)
    dirtied: bool = False

    @property
    def slept(self) -> bool:
        """The trial's delay held back at least one op (of the delayed stream, or the host's
        earlier side): only such a trial is evidence."""
        return self.sleeps > 0

    @property
    def race_made(self) -> bool:
        """The probe saw the later side run while the earlier side's work was pending."""
        return bool(self.probe and self.probe.get("later_pending"))


@contextmanager
def quiet_collector() -> Iterator[None]:
    """Python's cyclic garbage collected before a trial and held off during it: what an
    earlier trial left (its CUDA graphs, events, page-locked blocks) is freed here, never
    inside this trial, where a free could record or query an event while SGLang captures a
    CUDA graph (the CUDA runtime then invalidates the capture). A hypothesis for the capture
    failures of 2026-12-07 (docs/sglang-loop.md: GPU mode), not shown; it makes a trial's
    start the same whatever ran before."""
    gc.collect()
    with collector_paused():
        yield


def run_trial(variant_name: str, forcing: Forcing, serial: dict[str, Any] | None,
              probe: Any = None, access_locations: Sequence[str] = ()
              ) -> tuple[Trial, dict[str, Any] | None, list[str]]:
    """One run of the variant under ``forcing`` (``probe``: a gpu_probe.SideProbe watching
    the race's sides); its values compared with ``serial``; the names of the streams the loop
    held. With ``access_locations``, what the ops at those lines left is kept too (under
    ``"access"``) and compared with the serial run's (``Trial.access_wrong``)."""
    with quiet_collector():
        return _run_trial(variant_name, forcing, serial, probe, access_locations)


def _run_trial(variant_name: str, forcing: Forcing, serial: dict[str, Any] | None,
               probe: Any, access_locations: Sequence[str]
               ) -> tuple[Trial, dict[str, Any] | None, list[str]]:
    """:func:`run_trial`'s body, with the collector held off."""
    from overlap_harness.engines.core.necessity import format_error
    from overlap_harness.engines.sglang.driver import run_variant
    from overlap_harness.engines.sglang.gpu import access_values
    from overlap_harness.engines.sglang.gpu.access_values import (
        AccessCapture,
        first_access_difference,
    )
    from overlap_harness.engines.sglang.gpu.probe import without_machine_paths
    from overlap_harness.engines.sglang.variants import VARIANTS

    # a forced trial starts from dirtied caches: a read that runs before its write lands
    # reads the pattern, not what the serial run before it left in the same block
    dirtied = not forcing.serial and access_values.dirty_caches() > 0
    run = DeviceRun(forcing, probe,
                    capture=AccessCapture(access_locations) if access_locations else None)
    started = time.perf_counter()
    try:
        loop_run = run_variant(VARIANTS[variant_name], run)
        values = observe(loop_run)
        if run.capture is not None:
            values["access"] = run.capture.values()
    except Exception as exc:  # a crash is the trial's result, never raised
        torch.cuda.synchronize()
        return Trial(forcing.label(), error=without_machine_paths(format_error(exc)),
                     seconds=time.perf_counter() - started, sleeps=run.sleeps,
                     probe=probe.counts() if probe is not None else None,
                     stand_in_kernels=run.stand_in_kernels,
                     declared_kernel_calls=run.declared_kernel_calls, dirtied=dirtied), None, \
            run.streams_seen
    trial = Trial(forcing.label() + ("+probe" if probe is not None and not forcing.targeted
                                     else ""),
                  seconds=time.perf_counter() - started, sleeps=run.sleeps,
                  probe=probe.counts() if probe is not None else None,
                  stand_in_kernels=run.stand_in_kernels,
                  declared_kernel_calls=run.declared_kernel_calls, dirtied=dirtied)
    if serial is not None:
        trial.wrong = first_difference(
            {k: v for k, v in values.items() if not k.startswith(("access", ACCEPTANCE))},
            {k: v for k, v in serial.items() if not k.startswith(("access", ACCEPTANCE))})
        trial.acceptance_wrong = first_difference(
            {k: v for k, v in values.items() if k.startswith(ACCEPTANCE)},
            {k: v for k, v in serial.items() if k.startswith(ACCEPTANCE)})
        if run.capture is not None and "access" in serial:
            trial.access_wrong = first_access_difference(
                values["access"], serial["access"], access_locations,
                serial.get("access_unstable", ()))
    return trial, values, run.streams_seen


def forcings(delayed: Sequence[Sequence[str]], cycles: Sequence[int]) -> list[Forcing]:
    """One forcing per (stream set, cycle count)."""
    return [Forcing(tuple(streams), c) for streams in delayed for c in cycles]
