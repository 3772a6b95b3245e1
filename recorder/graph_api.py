"""``torch.cuda``'s CUDA-graph API while a watch runs, on top of :mod:`recorder.graphs`.

CPU mode fakes it (a CPU-only build has no ``CUDAGraph``): :class:`FakeCUDAGraph`,
``torch.cuda.graph`` (:class:`FakeGraphContext`: a device synchronize, then the capture on
``stream`` or on the watch's one default capture stream, as torch does),
``is_current_stream_capturing`` and ``graph_pool_handle``. GPU mode keeps torch's graphs and
wraps ``CUDAGraph.capture_begin``, ``capture_end``, ``replay`` and ``reset`` so the recording
follows them; the wrappers only do bookkeeping (no launch, no sync: a capture must not break).

``make_graphed_callables`` is the recorder's own in both modes, for the forward-only case (no
gradient needed: ``torch.no_grad()``, or no input or parameter requiring grad): warm-up
iterations on a side stream between device synchronizes, one graph per callable in one shared
pool, and a callable that copies new inputs into the static inputs, replays and returns the
static outputs. A backward graph is refused in one line (the watch's ``RecorderError``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils import _pytree

from overlap_harness.recorder.fake_streams import FakeStream, state
from overlap_harness.recorder.graphs import GraphSet, GraphState
from overlap_harness.recorder.names import variable_here

_ACTIVE: list[GraphSet] = []  # the running watch's graphs
_IN_GPU_MODE = "check it in GPU mode (--gpu)"
CAPTURE_STREAM = "capture_stream"  # the name of torch.cuda.graph's default capture stream
CAPTURE_STREAM_ID = -1  # its stream id in CPU mode (the program's streams count from 1)


def _graphs() -> GraphSet:
    if not _ACTIVE:
        raise RuntimeError("the recorder's CUDA graphs work only inside overlap_harness.watch()")
    return _ACTIVE[-1]


@contextmanager
def active(graphs: GraphSet) -> Iterator[GraphSet]:
    """Make ``graphs`` the CUDA graphs of the running watch inside the block."""
    _ACTIVE.append(graphs)
    try:
        yield graphs
    finally:
        _ACTIVE.pop()


class FakeCUDAGraph:
    """``torch.cuda.CUDAGraph`` in CPU mode, named after the variable it is assigned to."""

    def __init__(self, keep_graph: bool = False) -> None:
        self._state = _graphs().new_graph(variable_here())

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global",
                      **kwargs: Any) -> None:
        """Capture the current stream's work (and what forks from it) from now on."""
        self._state.begin(state().agent(None), pool)

    def capture_end(self) -> None:
        """End the capture: the template is ready to replay."""
        self._state.end()

    def instantiate(self) -> None:
        """Nothing to build in CPU mode."""

    def replay(self) -> None:
        """Issue the captured work on the current stream and compute its values."""
        self._state.replay(state().agent(None))

    def reset(self) -> None:
        """Drop the captured graph and leave its memory pool."""
        self._state.reset()

    def pool(self) -> tuple[int, int]:
        """The token of the graph's memory pool (to share it with another capture)."""
        if self._state.pool is None:
            raise RuntimeError("CUDAGraph.pool: the graph has no pool before capture_begin")
        return self._state.pool

    def enable_debug_mode(self) -> None:
        """Nothing to dump in CPU mode."""

    def debug_dump(self, debug_path: str) -> None:
        self._state.graphs.refuse("CUDAGraph.debug_dump in CPU mode", _IN_GPU_MODE)

    def raw_cuda_graph(self) -> int:
        self._state.graphs.refuse("CUDAGraph.raw_cuda_graph in CPU mode", _IN_GPU_MODE)

    def raw_cuda_graph_exec(self) -> int:
        self._state.graphs.refuse("CUDAGraph.raw_cuda_graph_exec in CPU mode", _IN_GPU_MODE)

    def __del__(self) -> None:
        try:  # noqa: SIM105 (a finalizer may run at interpreter exit, modules half gone)
            self._state.reset()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<torch.cuda.CUDAGraph {self._state.name} (faked on CPU)>"


class FakeGraphContext:
    """``torch.cuda.graph(g, pool=None, stream=None)`` in CPU mode: synchronize the device,
    make the capture stream current and capture into ``g`` until the block ends."""

    def __init__(self, cuda_graph: FakeCUDAGraph, pool: Any = None, stream: Any = None,
                 capture_error_mode: str = "global", **kwargs: Any) -> None:
        graphs = _graphs()
        if stream is None:
            stream = graphs.capture_stream
            if stream is None:
                stream = graphs.capture_stream = FakeStream.__new__(FakeStream)
                stream._setup(state(), CAPTURE_STREAM_ID, CAPTURE_STREAM)  # numbers no stream
        self.capture_stream = stream
        self.cuda_graph = cuda_graph
        self.pool = pool
        self._stream = torch.cuda.stream(stream)

    def __enter__(self) -> None:
        torch.cuda.synchronize()
        self._stream.__enter__()
        self.cuda_graph.capture_begin(self.pool)

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.cuda_graph.capture_end()
            else:  # the capture failed: keep the block's own error
                self.cuda_graph._state.abandon()
        finally:
            self._stream.__exit__(*exc)


def _is_current_stream_capturing() -> bool:
    capture = _graphs().recording.capture
    return capture is not None and capture.takes(state().agent(None))


def _graph_pool_handle() -> tuple[int, int]:
    return _graphs().new_pool()


def cpu_patches() -> list[tuple[Any, str, Any]]:
    """``(object, attribute, replacement)`` for CPU mode's CUDA-graph API."""
    names = {"CUDAGraph": FakeCUDAGraph, "graph": FakeGraphContext,
             "is_current_stream_capturing": _is_current_stream_capturing,
             "graph_pool_handle": _graph_pool_handle,
             "make_graphed_callables": make_graphed_callables,
             "empty_cache": _no_cache}
    patches = [(torch.cuda, name, value) for name, value in names.items()]
    return patches + [(torch.cuda.graphs, name, value) for name, value in names.items()
                      if name != "empty_cache"]


def _no_cache() -> None:
    """``torch.cuda.empty_cache()``: CPU mode caches no device memory."""


def gpu_patches(graphs: GraphSet, memory: Any) -> list[tuple[Any, str, Any]]:
    """``(object, attribute, wrapper)`` that make GPU mode's recording follow real graphs."""
    cls = torch.cuda.graphs.CUDAGraph
    original = {name: vars(cls)[name]
                for name in ("__new__", "capture_begin", "capture_end", "replay", "reset")}
    names: dict[int, str | None] = {}
    states: dict[int, tuple[Any, GraphState]] = {}

    def state_of(graph: Any) -> GraphState:
        entry = states.get(id(graph))
        if entry is None or entry[0] is not graph:
            entry = states[id(graph)] = (graph, graphs.new_graph(names.get(id(graph))))
        return entry[1]

    def new(klass: type, *args: Any, **kwargs: Any) -> Any:
        graph = original["__new__"].__func__(klass, *args, **kwargs)
        names[id(graph)] = variable_here()  # as CPU mode names it (the user's statement)
        return graph

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        original["capture_begin"](self, *args, **kwargs)
        stream = torch.cuda.current_stream()
        if stream == torch.cuda.graphs.graph.default_capture_stream:  # named as in CPU mode
            memory.stream_names.setdefault(stream.cuda_stream, CAPTURE_STREAM)
        try:
            pool = tuple(self.pool())
        except RuntimeError:  # no pool id to read: the graph's own pool
            pool = None
        state_of(self).begin(memory.current_agent(), pool)

    def capture_end(self: Any) -> None:
        try:
            original["capture_end"](self)
        except BaseException:
            state_of(self).abandon()
            raise
        state_of(self).end()

    def replay(self: Any) -> None:
        original["replay"](self)
        state_of(self).replay(memory.current_agent())

    def reset(self: Any) -> None:
        original["reset"](self)
        state_of(self).reset()

    wrappers = {"__new__": staticmethod(new), "capture_begin": capture_begin,
                "capture_end": capture_end, "replay": replay, "reset": reset}
    patches: list[tuple[Any, str, Any]] = [(cls, name, fn) for name, fn in wrappers.items()]
    graphed = [(module, "make_graphed_callables", make_graphed_callables)
               for module in (torch.cuda, torch.cuda.graphs)]
    return patches + graphed


class _GraphedCallable:
    """What ``make_graphed_callables`` returns for one callable (forward only)."""

    def __init__(self, graph: Any, inputs: tuple, outputs: tuple, spec: Any) -> None:
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.spec = spec

    def __call__(self, *args: Any) -> Any:
        for static, given in zip(self.inputs, _pytree.arg_tree_leaves(*args), strict=True):
            if not _same_memory(static, given):
                static.copy_(given)
        self.graph.replay()
        return _pytree.tree_unflatten([o.detach() for o in self.outputs], self.spec)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                      and a.storage_offset() == b.storage_offset())


def _needs_grad(fn: Any, args: tuple) -> bool:
    params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
    leaves = [*_pytree.arg_tree_leaves(*args), *params]
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


def make_graphed_callables(callables: Any, sample_args: tuple, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: Any = None) -> Any:
    """``torch.cuda.make_graphed_callables`` for the forward-only case (module docstring).

    Raises:
        RecorderError: a callable would need a backward graph (gradients enabled and an input
            or parameter requiring grad).
    """
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if any(_needs_grad(fn, args) for fn, args in zip(callables, sample_args, strict=True)):
        _graphs().refuse("torch.cuda.make_graphed_callables with a backward graph (gradients "
                         "enabled and an input or parameter requiring grad)",
                         "call it under torch.no_grad() for the forward graph")
    pool = torch.cuda.graph_pool_handle() if pool is None else pool
    torch.cuda.synchronize()
    warmup = torch.cuda.Stream()
    if isinstance(warmup, FakeStream):
        warmup.name = "warmup_stream"
    with torch.cuda.stream(warmup):
        for fn, args in zip(callables, sample_args, strict=True):
            for _ in range(num_warmup_iters):
                fn(*args)
    torch.cuda.synchronize()
    graphed: list[Any] = []
    for fn, args in zip(callables, sample_args, strict=True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn(*args)
        flat, spec = _pytree.tree_flatten(outputs)
        call = _GraphedCallable(graph, tuple(_pytree.arg_tree_leaves(*args)), tuple(flat), spec)
        if isinstance(fn, torch.nn.Module):
            fn.forward = _graphed_forward(fn, fn.training, call, fn.forward)
            graphed.append(fn)
        else:
            graphed.append(call)
    return graphed[0] if single else tuple(graphed)


def _graphed_forward(module: torch.nn.Module, training: bool, call: _GraphedCallable,
                     forward: Any) -> Any:
    """The module's forward: the graph while its training mode is the captured one."""
    def run(*args: Any, **kwargs: Any) -> Any:
        if module.training == training and not kwargs:
            return call(*args)
        return forward(*args, **kwargs)
    return run
