"""What the recorder does not model is refused, never passed silently.

A program that reaches an API the recorder cannot follow gets one line naming the call site,
the API and what to do instead, as a :class:`RecorderError`: ``check`` prints it and exits 2,
``watch()`` raises it. The refusal is also kept on the recording, so a program that catches the
exception (``except Exception``) still ends refused: ``Watch.__exit__`` and ``check_script``
raise it again.

Refused in both modes: CUDA IPC (an event made ``interprocess=True`` or its handle, a CUDA
storage shared with another process: the other process's stream work is never seen). Refused
in CPU mode, where nothing runs on a device: ``torch.Generator(device="cuda")`` and
``torch.cuda.default_generators``, the ``torch.cuda`` classes the fake has no stand-in for
(``ExternalStream``, ``MemPool``...), a CPU-mode device storage shared through
``torch.multiprocessing``, and any other ``torch.cuda`` function that fails on a CPU-only build
(its error becomes the one line).
"""

from __future__ import annotations

import inspect
import multiprocessing.queues
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import torch

from overlap_harness.model.errors import HarnessError
from overlap_harness.recorder.core import Recording
from overlap_harness.recorder.patching import Patch
from overlap_harness.recorder.sites import is_user_file, user_site

# torch.cuda classes with no CPU-mode stand-in (Stream, Event, StreamContext, device are faked;
# CUDA graphs have their own module; errors and storages are plain classes)
_SENT = "CUDA IPC (device memory sent to another process)"
_OTHER_PROCESS = "check each process on its own"
_CPU_CLASSES = ("ExternalStream", "MemPool", "CUDAPluggableAllocator", "GreenContext")


class RecorderError(HarnessError):
    """The recorder was asked for something it cannot do (a GPU mode without a GPU, an API it
    does not model); ``str()`` is one line."""


def refuse(recording: Recording, what: str, instead: str = "") -> NoReturn:
    """Refuse ``what`` at the user's call site: kept on ``recording`` and raised. Refused in
    another thread than the watching one (the main thread), the watching thread is also
    interrupted: it may be blocked waiting on the refused thread."""
    site = user_site()
    message = f"{site + ': ' if site else ''}{what} is not modelled by the recorder"
    if instead:
        message += f"; {instead}"
    recording.refused.append(message)
    if threading.get_ident() != recording.owner == threading.main_thread().ident:
        # a real signal wakes a main thread blocked on a lock (refusals_wake_the_watcher)
        signal.pthread_kill(recording.owner, recording.wake_signal or signal.SIGINT)
    raise RecorderError(message)


#: the signal a refusing thread wakes the watching main thread with: one of Linux's real-time
#: signals, which programs rarely use, so that SIGINT's disposition does not matter (a
#: program started in the background by a non-interactive shell, or under nohup, ignores
#: SIGINT, and a thread's refusal left its main thread blocked for good); elsewhere SIGINT
WAKE_SIGNAL: int | None = getattr(signal, "SIGRTMIN", None)
WAKE_SIGNAL = None if WAKE_SIGNAL is None else WAKE_SIGNAL + 3


@contextmanager
def refusals_wake_the_watcher(recording: Recording) -> Iterator[None]:
    """While a watch runs in the main thread, a refusal in another thread interrupts the
    main thread with :class:`RecorderError` (it may be blocked waiting on the refused
    thread: a queue, a join, an event). The handler is this module's, on
    :data:`WAKE_SIGNAL`, restored after; without that signal (not Linux) SIGINT wakes it,
    and the watch ends the KeyboardInterrupt as the refusal (``Watch.__exit__``)."""
    if WAKE_SIGNAL is None or threading.get_ident() != threading.main_thread().ident:
        yield
        return

    def woken(signum: int, frame: Any) -> None:
        if recording.refused:
            raise RecorderError(recording.refused[0])

    previous = signal.signal(WAKE_SIGNAL, woken)
    recording.wake_signal = WAKE_SIGNAL
    try:
        yield
    finally:
        recording.wake_signal = None
        signal.signal(WAKE_SIGNAL, previous)


def ipc_patches(recording: Recording, event_cls: type,
                is_device_storage: Callable[[torch.UntypedStorage], bool]) -> list[Patch]:
    """CUDA IPC refused (both modes): ``event_cls``'s IPC handles; device memory sent to another
    process, refused where the program sends it (a ``multiprocessing`` queue pickles in a
    feeder thread, where a refusal would leave the program waiting on its ``get()``)."""
    def no_ipc(what: str) -> Callable[..., NoReturn]:
        def refused(*args: Any, **kwargs: Any) -> NoReturn:
            refuse(recording, what, _OTHER_PROCESS)
        return refused

    def checked_put(original: Callable[..., Any]) -> Callable[..., Any]:
        def put(queue: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
            if any(is_device_storage(t.untyped_storage()) for t in _tensors_in(obj)):
                refuse(recording, _SENT, _OTHER_PROCESS)
            return original(queue, obj, *args, **kwargs)
        return put
    patches: list[Patch] = [
        (event_cls, "ipc_handle", no_ipc("CUDA IPC (Event.ipc_handle)")),
        (event_cls, "from_ipc_handle", staticmethod(no_ipc("CUDA IPC (Event.from_ipc_handle)"))),
        (torch.UntypedStorage, "_share_cuda_", no_ipc(_SENT))]
    for queue_cls in (multiprocessing.queues.Queue, multiprocessing.queues.JoinableQueue):
        patches.append((queue_cls, "put", checked_put(vars(queue_cls)["put"])))
    return patches


def _tensors_in(obj: Any, depth: int = 3) -> list[torch.Tensor]:
    """The tensors in ``obj`` and in the lists, tuples and dict values it nests."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth == 0:
        return []
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list | tuple) else ()
    return [t for item in items for t in _tensors_in(item, depth - 1)]


def cpu_patches(recording: Recording, faked: set[str],
                is_device_storage: Callable[[torch.UntypedStorage], bool]) -> list[Patch]:
    """CPU mode's refusals: generators, classes without a stand-in, sharing device memory,
    and every ``torch.cuda`` function not in ``faked`` turned into a refusal when it fails."""
    cpu_only = "check it in GPU mode (--gpu)"
    original_generator = torch.Generator

    class Generator(original_generator):  # type: ignore[misc, valid-type]
        """``torch.Generator``: a CUDA one is refused in CPU mode."""

        def __new__(cls, device: Any = "cpu") -> Any:
            if torch.device(device).type == "cuda":
                refuse(recording, 'torch.Generator(device="cuda") in CPU mode', cpu_only)
            return original_generator.__new__(cls, device)

    class DefaultGenerators(tuple):
        """``torch.cuda.default_generators``: refused on use in CPU mode."""

        def __getitem__(self, index: Any) -> NoReturn:
            refuse(recording, "torch.cuda.default_generators in CPU mode", cpu_only)

    patches: list[Patch] = [(torch, "Generator", Generator),
                            (torch.cuda, "default_generators", DefaultGenerators())]
    for name in _CPU_CLASSES:
        if hasattr(torch.cuda, name):
            patches.append((torch.cuda, name, _refusing_class(recording, f"torch.cuda.{name}",
                                                              cpu_only)))
    for name, value in vars(torch.cuda).items():
        if (not name.startswith("_") and name not in faked and inspect.isfunction(value)
                and value.__module__.startswith("torch.cuda")):
            patches.append((torch.cuda, name, _failing_is_refused(recording, name, value)))

    def no_sharing(original: Callable[..., Any]) -> Callable[..., Any]:
        def share(storage: torch.UntypedStorage, *args: Any, **kwargs: Any) -> Any:
            if is_device_storage(storage):
                refuse(recording, _SENT, _OTHER_PROCESS)
            return original(storage, *args, **kwargs)
        return share
    for name in ("_share_fd_cpu_", "_share_filename_cpu_"):
        patches.append((torch.UntypedStorage, name,
                        no_sharing(getattr(torch.UntypedStorage, name))))
    return patches


def _refusing_class(recording: Recording, what: str, instead: str) -> type:
    def new(cls: type, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(recording, f"{what} in CPU mode", instead)
    return type(what.rpartition(".")[2], (), {"__new__": new,
                                             "__doc__": f"{what}: refused in CPU mode."})


def _failing_is_refused(recording: Recording, name: str,
                        original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.<name>`` that, when the program's own call fails on this CPU-only build, is
    refused in one line (its error named) instead of the error's traceback. A call from
    torch's own code fails as it would without the watch (torch may expect and catch it)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except HarnessError:
            raise
        except Exception as exc:
            if not is_user_file(sys._getframe(1).f_code.co_filename):
                raise
            reason = (str(exc).strip().splitlines() or [""])[0][:120]
            refuse(recording, f"torch.cuda.{name}() in CPU mode (it failed: "
                              f"{type(exc).__name__}: {reason})", "check it in GPU mode (--gpu)")
    call.__name__ = call.__qualname__ = name
    call.__doc__ = original.__doc__
    return call
