"""Kernels the dispatcher cannot see, and how to declare what they read and write.

A raw Triton launch or a custom extension touches device memory through raw pointers, never
through an aten op, so the dispatch mode cannot know its accesses. The recorder notices such a
kernel when it asks a device tensor for its ``data_ptr()`` and records an op of *unknown
access* (``watch().unknown_ops``, printed by ``check``). Its accesses can be declared:

* :func:`declare_kernel` registers a declaration for a kernel named ``"module:attribute"``
  (patched in that module while a watch runs) or for a Triton ``JITFunction`` object (its
  ``run`` is wrapped), optionally with a CPU implementation that computes the same values
  where the kernel cannot run (CPU mode, no Triton);
* :func:`declared` is the same as a decorator on the user's own launching function.

A declared call runs quietly (its internal aten ops are not recorded, nor its host reads
of device memory, ``tolist()`` or ``torch.tensor(..., device="cuda")``, which would
otherwise add a host sync the real kernel never makes; its fresh outputs are still watched)
and becomes one op on the current stream with the declared accesses.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from overlap_harness.recorder.patching import Patch, patched


@dataclass(frozen=True, slots=True)
class DeclaredAccess:
    """One access a kernel makes: ``tensor`` (its whole view, or the rows of dim 0 named by
    ``rows``), read or written."""

    tensor: torch.Tensor
    write: bool
    rows: torch.Tensor | None = None


def reads(tensor: torch.Tensor | None, rows: torch.Tensor | None = None) -> list[DeclaredAccess]:
    """A read of ``tensor`` (or of its rows ``rows``); nothing for None."""
    return [] if tensor is None else [DeclaredAccess(tensor, False, rows)]


def writes(tensor: torch.Tensor | None, rows: torch.Tensor | None = None) -> list[DeclaredAccess]:
    """A write of ``tensor`` (or of its rows ``rows``); nothing for None."""
    return [] if tensor is None else [DeclaredAccess(tensor, True, rows)]


AccessFn = Callable[..., Iterable[DeclaredAccess]]  # (result, *args, **kwargs) -> accesses


@dataclass(frozen=True, slots=True)
class KernelDeclaration:
    """What a kernel touches: ``accesses(result, *args, **kwargs)``; ``cpu_impl`` computes
    its values in CPU mode (None: run the kernel itself)."""

    name: str
    accesses: AccessFn
    cpu_impl: Callable[..., Any] | None = None


class KernelSink(Protocol):
    """What a running watch offers a declared call. A sink may also define
    ``implementation(declaration, original) -> callable``, which then picks what runs in
    place of ``cpu_mode``'s rule (a device run: the kernel itself where it can run)."""

    cpu_mode: bool

    def quiet(self) -> AbstractContextManager[None]:
        """Record nothing of the ops inside (fresh outputs are still watched)."""
        ...

    def record_declared(self, name: str, accesses: Callable[[], Iterable[DeclaredAccess]],
                        rerun: Callable[[], Any] | None = None) -> None:
        """One op on the current stream with the accesses ``accesses()`` gives (a
        declaration may read index values on the host: that read is not the program's);
        ``rerun()`` runs the call again (for the replays of a CUDA graph that captured it,
        which take their accesses from ``accesses()`` again, with the values of the moment)."""
        ...


_SINKS: list[KernelSink] = []
_BY_NAME: dict[str, KernelDeclaration] = {}  # "module:attribute" -> declaration
_BY_OBJECT: dict[int, tuple[Any, KernelDeclaration]] = {}  # id(kernel) -> (kernel, decl)


def _call(decl: KernelDeclaration, original: Callable[..., Any], *args: Any,
          **kwargs: Any) -> Any:
    if not _SINKS:
        return original(*args, **kwargs)
    sink = _SINKS[-1]
    choose = getattr(sink, "implementation", None)  # optional: a sink that picks per kernel
    if choose is not None:
        impl = choose(decl, original)
    else:
        impl = decl.cpu_impl if (sink.cpu_mode and decl.cpu_impl is not None) else original
    with sink.quiet():
        result = impl(*args, **kwargs)
    sink.record_declared(decl.name, functools.partial(decl.accesses, result, *args, **kwargs),
                         functools.partial(impl, *args, **kwargs))
    return result


def declare_kernel(kernel: str | Any, accesses: AccessFn,
                   cpu_impl: Callable[..., Any] | None = None, name: str | None = None) -> None:
    """Declare what ``kernel`` reads and writes.

    Args:
        kernel: ``"package.module:function"`` (the function is replaced in its module while a
            watch runs) or a Triton ``JITFunction`` (its ``run`` is wrapped while a watch runs).
        accesses: ``accesses(result, *args, **kwargs)`` -> :func:`reads` / :func:`writes`.
        cpu_impl: computes the same values where the kernel cannot run (CPU mode).
        name: the op's name in reports (default: the kernel's).

    Raises:
        TypeError: ``kernel`` is neither a ``"module:function"`` string nor has ``run``.
    """
    if isinstance(kernel, str):
        if ":" not in kernel:
            raise TypeError(f"declare_kernel: expected 'module:function', got {kernel!r}")
        _BY_NAME[kernel] = KernelDeclaration(name or kernel.split(":")[1], accesses, cpu_impl)
    elif hasattr(kernel, "run"):
        label = name or getattr(kernel, "__name__", type(kernel).__name__)
        _BY_OBJECT[id(kernel)] = (kernel, KernelDeclaration(label, accesses, cpu_impl))
    else:
        raise TypeError(f"declare_kernel: expected 'module:function' or a Triton kernel, got "
                        f"{type(kernel).__name__}")


def declared(accesses: AccessFn, cpu_impl: Callable[..., Any] | None = None,
             name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the function launches a kernel that touches ``accesses``.

    Example::

        @declared(lambda out, x, idx: reads(x, rows=idx) + writes(out))
        def my_gather(x, idx):
            out = torch.empty(...); my_extension.gather(out, x, idx); return out
    """
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        decl = KernelDeclaration(name or fn.__name__, accesses, cpu_impl)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return _call(decl, fn, *args, **kwargs)
        return call
    return wrap


def _patches() -> list[Patch]:
    """``(object, attribute, wrapper)`` for every registered kernel that can be found."""
    out = []
    for target, decl in _BY_NAME.items():
        module_name, _, attribute = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        original = getattr(module, attribute, None)
        if original is None:
            continue
        out.append((module, attribute, functools.partial(_call, decl, original)))
    for kernel, decl in _BY_OBJECT.values():
        out.append((kernel, "run", functools.partial(_call, decl, kernel.run)))
    return out


@contextmanager
def installed(sink: KernelSink) -> Iterator[None]:
    """Route declared kernels to ``sink`` inside the block; undo every patch on the way out."""
    _SINKS.append(sink)
    try:
        with patched(_patches()):
            yield
    finally:
        _SINKS.pop()
