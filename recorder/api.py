"""The public API: ``watch()`` a block of real PyTorch stream code, or ``check_script()``.

``with watch() as w: ...`` records everything the block does on its streams (see
:mod:`recorder.core`) and, on exit, holds the verdict: ``w.races`` (every race, as
:class:`model.trace.Race`, with both access sites in the user's code), ``w.run`` (a
:class:`model.trace.DeviceRun` for the reports), ``w.unknown_ops`` (kernels whose accesses
nobody declared), ``w.notes`` (portability notes: non-blocking copies of pageable memory),
``w.mark_of(access)`` (the loop iteration an access was issued in, :mod:`recorder.iterations`;
``w.iteration(i)`` names the iterations of a loop itself). ``mode="cpu"`` fakes CUDA on the
CPU (the default without a GPU); ``mode="gpu"`` watches real streams; ``mode="auto"`` picks
the GPU when there is one. Every patch is undone on exit, also when the block raises.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from overlap_harness.model.results import CaseResult
from overlap_harness.model.trace import DeviceRun, OpKind, Race
from overlap_harness.recorder import buffer_exports, graph_api, kernels, project_kernels
from overlap_harness.recorder.accelerator_fakes import accelerator_patches
from overlap_harness.recorder.core import Access, Recording, Replayable, UnknownOp
from overlap_harness.recorder.cpu_mode import CpuMemory, FakeCudaFunctionMode
from overlap_harness.recorder.dispatch import RecordingDispatchMode, access_of
from overlap_harness.recorder.elements import row_elements, to_storage_elements
from overlap_harness.recorder.fake_streams import (
    CudaState,
    FakeEvent,
    active,
    cuda_patches,
)
from overlap_harness.recorder.graphs import GraphSet
from overlap_harness.recorder.iterations import IterationMark, LoopCounter
from overlap_harness.recorder.numpy_entry import numpy_patches
from overlap_harness.recorder.patching import patched
from overlap_harness.recorder.pinned_views import device_view_of
from overlap_harness.recorder.storages import StorageResizes
from overlap_harness.recorder.threads import HostThreads, entered, thread_patches
from overlap_harness.recorder.unmodelled import (
    RecorderError,
    cpu_patches,
    ipc_patches,
    refusals_wake_the_watcher,
    refuse,
)

MODES = ("auto", "cpu", "gpu")
_RUNNING: list[Watch] = []  # the watch in progress (torch's modes and patches are global)


def resolve_mode(mode: str) -> str:
    """``"cpu"`` or ``"gpu"`` for ``mode``; ``auto`` is the GPU when CUDA is available."""
    if mode not in MODES:
        raise RecorderError(f"mode: expected one of {'|'.join(MODES)}, got {mode!r}")
    if mode == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if mode == "gpu" and not torch.cuda.is_available():
        raise RecorderError("mode 'gpu' needs a CUDA device; this torch sees none "
                            "(use mode 'cpu', the default without a GPU)")
    return mode


class Watch:
    """A running (then finished) recording; see the module docstring."""

    def __init__(self, mode: str = "auto") -> None:
        self.mode = resolve_mode(mode)
        self.cpu_mode = self.mode == "cpu"
        self.recording = Recording()
        self.loops = LoopCounter()
        self._stack: ExitStack | None = None

    # -- results ---------------------------------------------------------------------------
    @property
    def races(self) -> list[Race]:
        """Every race found (so far, while the block runs)."""
        return list(self.recording.races)

    @property
    def run(self) -> DeviceRun:
        """The run as the reports read it."""
        return self.recording.device_run()

    @property
    def unknown_ops(self) -> list[UnknownOp]:
        """Ops that touched device memory with accesses nobody declared."""
        return list(self.recording.unknown_ops)

    @property
    def complete(self) -> bool:
        """True when the verdict saw everything: no op of unknown access touched watched
        memory and nothing unmodelled was reached. A pytest marker or any other caller that
        turns ``races`` into a pass must also require this."""
        return not self.recording.unknown_ops and not self.recording.refused

    @property
    def buffer_sites(self) -> dict[str, str]:
        """Each tensor's name in reports -> the ``file:line`` that allocated it."""
        return dict(self.recording.buffer_sites)

    @property
    def wait_bindings(self) -> list[tuple[int, int]]:
        """(record node, wait node): the record each stream wait bound to, in issue order."""
        return list(self.recording.wait_bindings)

    @property
    def marks(self) -> dict[int, IterationMark]:
        """Node id -> the loop iteration it was issued in (nodes outside loops absent)."""
        return dict(self.recording.marks.by_op)

    @property
    def notes(self) -> list[Any]:
        """Portability notes (:class:`recorder.pageable.PortabilityNote`), not races."""
        return list(self.recording.notes)

    def mark_of(self, access: Any) -> IterationMark | None:
        """The iteration a race's access (``race.first``, ``race.second``) was issued in."""
        return self.recording.marks.of(access.op)

    def iteration(self, name: int | str) -> None:
        """Name the iteration the program is in: every op issued from now until the next
        call is marked ``iteration <name>`` in reports, in place of the counted loop pass. An
        int also becomes the ops' ``iteration`` in the run's timeline and races (-1 before
        the first call), which the timeline plot draws and the engine adapters report."""
        self.recording.marks.named = name
        if isinstance(name, int):
            self.recording.iteration = name
    def device_view(self, pinned: torch.Tensor) -> torch.Tensor:
        """A device (UVA) view of the pinned tensor ``pinned``: kernels that read it read the
        pinned buffer, on their stream (:mod:`recorder.pinned_views`). CPU mode only."""
        if not self.cpu_mode:
            raise RecorderError("device_view: GPU mode sees real UVA views as device memory; "
                                "only CPU mode fakes them")
        return device_view_of(self.memory.device_views, pinned)

    # -- the kernel sink (recorder.kernels) ------------------------------------------------
    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Record no op inside (a declared kernel's own internals); watch fresh outputs."""
        self.dispatch.quiet += 1
        try:
            yield
        finally:
            self.dispatch.quiet -= 1

    def record_declared(self, name: str,
                        accesses: Callable[[], Iterable[kernels.DeclaredAccess]],
                        rerun: Callable[[], Any] | None = None) -> None:
        """One op on the current stream with the declared accesses, evaluated with the
        recording paused (the declaration's own reads of index values are not the program's).
        In CPU mode a CUDA graph capturing it runs ``rerun()`` at each replay and evaluates
        ``accesses()`` again: a captured kernel indexed by a static buffer touches the rows
        the buffer names at that replay, not those of the capture."""
        def evaluate() -> list[Access]:
            self.dispatch.paused += 1  # the helpers' own torch calls are not the program's
            try:
                with torch._C.DisableTorchFunction():
                    return self._declared_accesses(accesses())
            finally:
                self.dispatch.paused -= 1

        replay = None
        if rerun is not None and self.cpu_mode and self.recording.capture is not None:
            replay = Replayable(rerun, evaluate)
        self.recording.op(name, self.memory.current_agent(), evaluate(), OpKind.KERNEL,
                          replay=replay)

    def _declared_accesses(self, accesses: Iterable[kernels.DeclaredAccess]) -> list[Access]:
        out: list[Access] = []
        for declared in accesses:
            t = declared.tensor
            info = self.memory.lookup(t)
            if info is None:
                continue
            if declared.rows is None:
                out.append(access_of(info, t, declared.write))
            else:
                ids = row_elements(t, declared.rows)
                out.append(Access(info, to_storage_elements(ids, t.element_size(),
                                                            info.itemsize), declared.write))
        return out

    # -- the context -----------------------------------------------------------------------
    def __enter__(self) -> Watch:
        if _RUNNING:
            raise RecorderError("watch() blocks do not nest: one is running already")
        stack = ExitStack()
        try:
            if self.cpu_mode:
                self._enter_cpu(stack)
            else:
                self._enter_gpu(stack)
            stack.enter_context(kernels.installed(self))
            stack.enter_context(patched(self._storage_resizes().patches()))
            threads = HostThreads(self.recording)
            self.recording.issuing = threads.host
            stack.enter_context(patched(thread_patches(
                threads, lambda: entered(self.dispatch, self._function_mode),
                lambda: self.dispatch.live)))
            self.recording.marks.counter = stack.enter_context(self.loops.counting())
            stack.enter_context(refusals_wake_the_watcher(self.recording))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        _RUNNING.append(self)
        return self

    def _refuse(self, what: str, instead: str = "") -> NoReturn:
        """An API the recorder does not model: refused in one line (``recorder.unmodelled``)."""
        refuse(self.recording, what, instead)

    def _enter_cpu(self, stack: ExitStack) -> None:
        stack.enter_context(_environment("TRITON_INTERPRET", "1"))  # Triton kernels the
        # program imports from now on run on the CPU (Triton reads it at import)
        cuda = CudaState(self.recording)
        self.memory = CpuMemory(self.recording, cuda)
        self.dispatch = RecordingDispatchMode(self.recording, self.memory)
        stack.enter_context(active(cuda))
        faked = cuda_patches()
        graph_faked = graph_api.cpu_patches()  # CUDA graphs: modelled, never refused
        stack.enter_context(patched(faked))
        stack.enter_context(patched(accelerator_patches()))  # torch.Event, torch.accelerator
        stack.enter_context(patched(
            cpu_patches(self.recording,
                        {name for obj, name, _ in faked + graph_faked if obj is torch.cuda},
                        lambda storage: self._is_device_storage(storage))
            + ipc_patches(self.recording, FakeEvent, self._is_device_storage)))
        cuda.agent(None)  # the default stream is agent 1, as on the simulated device
        function_mode = FakeCudaFunctionMode(self.memory, self.dispatch)
        stack.enter_context(patched(function_mode.patches()))
        graphs = GraphSet(self.recording, True, self.dispatch, self._refuse)
        stack.enter_context(graph_api.active(graphs))
        stack.enter_context(patched(graph_faked))
        stack.enter_context(self.dispatch)
        stack.enter_context(function_mode)
        stack.enter_context(patched(numpy_patches(function_mode.host_view)))
        stack.enter_context(buffer_exports.closing(self.recording))
        self._function_mode: Any = function_mode

    def _enter_gpu(self, stack: ExitStack) -> None:
        from overlap_harness.recorder import gpu_mode  # deferred: touches torch.cuda's trace hooks

        self.memory = gpu_mode.GpuMemory(self.recording)
        self.dispatch = RecordingDispatchMode(self.recording, self.memory)
        stack.enter_context(gpu_mode.traced(self.recording, self.memory))
        graphs = GraphSet(self.recording, False, self.dispatch, self._refuse)
        stack.enter_context(graph_api.active(graphs))
        stack.enter_context(patched(graph_api.gpu_patches(graphs, self.memory)))
        stack.enter_context(patched(ipc_patches(
            self.recording, torch.cuda.Event, lambda storage: storage.device.type == "cuda")))
        stack.enter_context(self.dispatch)
        self._function_mode = gpu_mode.GpuFunctionMode(self.memory, self.dispatch)
        stack.enter_context(self._function_mode)
        stack.enter_context(patched(numpy_patches(self._function_mode.host_view)))
        stack.enter_context(buffer_exports.closing(self.recording))

    def _storage_resizes(self) -> StorageResizes:
        """Storage resizes as frees, allocations and moves (:mod:`recorder.storages`)."""
        if self.cpu_mode:  # an empty storage is device memory only if it was seen emptied
            def device_storage(storage: torch.UntypedStorage) -> bool:
                return False
        else:
            def device_storage(storage: torch.UntypedStorage) -> bool:
                return storage.device.type == "cuda"
        resizes = StorageResizes(self.recording, self.memory, self.dispatch, device_storage)
        self.dispatch.resizes = resizes
        return resizes

    def _is_device_storage(self, storage: torch.UntypedStorage) -> bool:
        info = self.recording.storages.get(storage.data_ptr())
        return info is not None and not info.pinned

    def __exit__(self, exc_type: object, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            _RUNNING.remove(self)
            self.dispatch.live = False  # threads that outlive the watch record nothing more
            stack.close()
        self.recording.sweep()
        refused = self.recording.refused
        if refused and exc_type in (None, KeyboardInterrupt):  # caught by the program, or
            raise RecorderError(refused[0])  # the interrupt of a refusing thread


@contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    """``os.environ[name]`` is ``value`` inside (unless the user set it); restored after."""
    previous = os.environ.get(name)
    if previous is None:
        os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)


def iteration(name: int | str) -> None:
    """Name the running watch's iteration (:meth:`Watch.iteration`); usable in a script that
    ``check_script`` runs, and a no-op when no watch is running (the script runs as usual)."""
    if _RUNNING:
        _RUNNING[-1].iteration(name)


def watch(mode: str = "auto") -> Watch:
    """Record the block's stream work and check it: ``with watch() as w: ...; w.races``.

    Raises:
        RecorderError: an unknown ``mode``, or ``"gpu"`` without a CUDA device.
    """
    return Watch(mode)


@dataclass(slots=True)
class CheckResult:
    """What ``check_script`` found: the races, the run, and how the script ended."""

    script: str
    argv: list[str]
    mode: str
    races: list[Race] = field(default_factory=list)
    run: DeviceRun = field(default_factory=DeviceRun)
    unknown_ops: list[UnknownOp] = field(default_factory=list)
    buffer_sites: dict[str, str] = field(default_factory=dict)
    wait_bindings: list[tuple[int, int]] = field(default_factory=list)  # record -> wait
    marks: dict[int, IterationMark] = field(default_factory=dict)  # node id -> its iteration
    notes: list[Any] = field(default_factory=list)  # portability notes, not races
    error: str | None = None  # the script's traceback when it crashed
    refused: str | None = None  # the one line refusing an API the recorder does not model
    exit_status: int = 0  # the script's own ``sys.exit`` status
    interrupted: bool = False  # Ctrl-C stopped the script: the races are those seen before

    @property
    def complete(self) -> bool:
        """The verdict saw everything (see :attr:`Watch.complete`)."""
        return not self.unknown_ops and self.refused is None

    @property
    def crashed(self) -> bool:
        """The script raised, or exited with a non-zero status."""
        return self.error is not None

    def to_case(self) -> CaseResult:
        """The result as a scenario run, for the reports (timeline, Perfetto, SARIF)."""
        name = Path(self.script).name
        verdict = "error" if self.crashed else ("race" if self.races else "race_free")
        # no expectation: a user's program is not a scenario that states one (the plot's
        # title then gives the verdict alone, never "FAIL, expected race_free")
        return CaseResult(run_id=name, scenario=name, mutation="", path=self.script,
                          expect="", verdict=verdict, ok=not self.races,
                          races=list(self.races), error=self.error,
                          timeline=list(self.run.timeline), waits=list(self.wait_bindings))


def _script_traceback(exc: BaseException) -> str:
    """The script's own traceback: frames of the recorder and of runpy left out."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "runpy" not in f.filename and f"{os.sep}recorder{os.sep}" not in f.filename]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames)]
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def check_script(path: str | Path, argv: Sequence[str] = (), mode: str = "auto") -> CheckResult:
    """Run the Python script ``path`` as ``__main__`` with ``argv`` under :func:`watch`.

    The script sees ``sys.argv == [path, *argv]``, its own folder first on ``sys.path`` and
    the caller's environment. A crash (an exception, or a non-zero ``sys.exit``) is kept in
    the result with the script's traceback; races found before it are kept too. Ctrl-C
    stops the script and keeps what was seen before it (``interrupted``).

    Raises:
        RecorderError: ``path`` is not a readable file, the mode cannot run here, or the
            script used an API the recorder does not model.
    """
    script = Path(path)
    if not script.is_file():
        raise RecorderError(f"{path}: no such script")
    result = CheckResult(str(path), list(argv), resolve_mode(mode))
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(script.resolve().parent))
    watcher = Watch(result.mode)
    try:
        with watcher:
            runpy.run_path(str(script), run_name="__main__")
    except RecorderError as exc:  # an unmodelled API: one line, not the script's crash
        result.refused = str(exc)
    except SystemExit as exc:
        code = exc.code
        if code not in (None, 0):
            result.exit_status = code if isinstance(code, int) else 1
            result.error = f"the script exited with status {code}"
    except Exception as exc:  # the script's own crash: reported, not raised
        result.error = _script_traceback(exc)
    except KeyboardInterrupt:
        if not watcher.recording.refused:  # Ctrl-C: what was seen so far is the result
            result.interrupted = True
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    if result.refused is None and watcher.recording.refused:
        result.refused = watcher.recording.refused[0]
    result.races = watcher.races
    result.run = watcher.run
    result.unknown_ops = watcher.unknown_ops
    result.buffer_sites = watcher.buffer_sites
    result.wait_bindings = watcher.wait_bindings
    result.marks = watcher.marks
    result.notes = watcher.notes
    return result


project_kernels.register()  # the project's own Triton gather is declared from the start
