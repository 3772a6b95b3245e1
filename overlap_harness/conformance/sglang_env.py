"""The one place SGLang 0.5.23 is imported for the conformance run, and everything stubbed.

SGLang is imported, never copied: the wheel is installed with ``pip install --no-deps
sglang==0.5.23`` plus the ``sglang`` extra's light packages (docs/sglang-conformance.md). On a
CPU machine three things stand between that wheel and a run of its FutureMap:

1. ``sglang.srt.speculative.spec_utils`` (home of ``spec_need_hidden_states``, called by
   ``FutureMap._maybe_init_forward_bufs`` on the first EAGLE stash) imports the scheduler batch
   and through it huggingface_hub, transformers and torchvision: a server's dependencies, not
   the relay's. It is replaced by :data:`SPEC_UTILS_STUB` below, whose one function answers as
   the real one does for plain EAGLE (``speculative_algorithm`` not STANDALONE/DFLASH/DSPARK and
   multi-layer EAGLE off: hidden states are relayed).
2. ``overlap_utils._is_cuda`` / ``_is_hip`` are fixed when the module is imported
   (``is_cuda()`` is False on a CPU build), and they choose the CUDA branches the conformance
   run is about: the pinned ``new_seq_lens_cpu_pinned`` mirror and the private
   ``fwd_prepare_d2h_stream``. :func:`cuda_branches` switches them for the length of a run.
3. ``overlap_utils.gather_spec_extras`` (from ``sglang.kernels.ops.speculative``) is a raw
   Triton launch, which no dispatch mode sees. It runs as itself under ``TRITON_INTERPRET=1``
   (set here before triton is imported), declared to the recorder with
   ``recorder.declare_kernel`` (:func:`declare_gather`): it reads ``indices`` and the rows
   they name of each relay buffer and writes its fresh outputs, the accesses of the project's
   own Triton gather (``recorder.project_kernels.gather_accesses``, same signature).

Nothing else is stubbed: ``SpeculativeAlgorithm`` (``sglang.srt.speculative.spec_info``),
``FutureMap``, ``RelayPayload`` and ``resolve_forward_inputs`` are SGLang's own.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.model.errors import HarnessError
from overlap_harness.recorder.project_kernels import gather_accesses

SGLANG_VERSION = "0.5.23"
INSTALL_HINT = ("pip install -e '.[sglang]' && pip install --no-deps sglang==0.5.23 "
                "(docs/sglang-conformance.md)")


class SglangUnavailableError(HarnessError):
    """SGLang 0.5.23 is not installed, is another version, or its import failed."""


def _spec_need_hidden_states() -> bool:
    """Plain EAGLE relays hidden states (spec_utils.spec_need_hidden_states in 0.5.23 returns
    False only for STANDALONE, DFLASH, DSPARK or multi-layer EAGLE)."""
    return True


SPEC_UTILS_STUB = types.ModuleType("sglang.srt.speculative.spec_utils")
SPEC_UTILS_STUB.__doc__ = ("Stub installed by overlap_harness.conformance.sglang_env: the real "
                           "module imports transformers and torchvision through schedule_batch.")
SPEC_UTILS_STUB.spec_need_hidden_states = _spec_need_hidden_states  # type: ignore[attr-defined]


def installed_version() -> str | None:
    """The installed sglang distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


OVERLAP_UTILS = "sglang.srt.managers.overlap_utils"


@functools.cache
def unavailable_reason() -> str | None:
    """Why the conformance run cannot import SGLang here (one line), or None when it can.

    Tries the real import of ``sglang.srt.managers.overlap_utils`` (with the stubs above, a
    few seconds, once per process), so the reason is the import's own error, e.g. a package
    the ``sglang`` extra should have installed."""
    version = installed_version()
    if version is None:
        return f"sglang is not installed: {INSTALL_HINT}"
    if version != SGLANG_VERSION:
        return f"sglang {version} is installed, the conformance run follows {SGLANG_VERSION}"
    with _import_setting():
        failure = import_failure(OVERLAP_UTILS)
    return None if failure is None else f"{failure} ({INSTALL_HINT})"


def import_failure(module: str) -> str | None:
    """Import ``module``; None when it imports, else one line with the error.

    A failed import leaves behind the modules it had finished, among them subpackages whose
    parent's own import failed (``sglang.srt`` without ``sglang``). The next import below
    that parent then fails inside importlib (``KeyError: 'sglang'`` from a namespace path),
    so one test's missing package would break every later one. Everything the attempt added
    under ``module``'s top-level package, and every module it added whose parent package is
    gone, is removed again: the next import starts clean."""
    top = module.partition(".")[0]
    before = set(sys.modules)
    try:
        importlib.import_module(module)
    except Exception as exc:  # any import-time error is a reason, not a crash
        added = [name for name in sys.modules if name not in before]
        for name in added:
            if name.partition(".")[0] == top or not _parent_loaded(name):
                sys.modules.pop(name, None)
        return f"import {module} failed: {type(exc).__name__}: {exc}"
    return None


def _parent_loaded(name: str) -> bool:
    parent = name.rpartition(".")[0]
    return not parent or parent in sys.modules


@contextmanager
def _import_setting() -> Iterator[None]:
    """What SGLang's modules are imported under: the spec_utils stub and, without CUDA,
    ``TRITON_INTERPRET=1``. Triton decides interpreted vs compiled when a kernel is defined,
    so SGLang's kernels run on the CPU if it is set while their modules are imported; it is
    restored after, so it never leaks into what the process does next. On a GPU they
    compile, as in a server."""
    previous = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    stubbed = sys.modules.setdefault(SPEC_UTILS_STUB.__name__, SPEC_UTILS_STUB) is SPEC_UTILS_STUB
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
        if stubbed and "sglang" not in sys.modules:  # a failed import: leave nothing behind
            sys.modules.pop(SPEC_UTILS_STUB.__name__, None)


def load_overlap_utils() -> types.ModuleType:
    """Import ``sglang.srt.managers.overlap_utils`` with the stubs above; raises
    :class:`SglangUnavailableError` with one line when it cannot."""
    reason = unavailable_reason()
    if reason is not None:
        raise SglangUnavailableError(reason)
    with _import_setting():
        overlap_utils = importlib.import_module(OVERLAP_UTILS)  # imported by the check above
    declare_gather(overlap_utils)
    return overlap_utils


def declare_gather(overlap_utils: types.ModuleType) -> None:
    """Declare SGLang's Triton ``gather_spec_extras`` (as overlap_utils calls it) to the
    recorder; it runs as itself (interpreted on the CPU), quietly, as one op (idempotent)."""
    recorder.declare_kernel(f"{overlap_utils.__name__}:gather_spec_extras", gather_accesses,
                            name="sglang.gather_spec_extras")


def speculative_algorithm(name: str | None) -> Any:
    """SGLang's own ``SpeculativeAlgorithm`` member for ``name`` (None: no speculation)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # deferred: optional

    return SpeculativeAlgorithm.from_string(name)


@contextmanager
def cuda_branches(overlap_utils: types.ModuleType, *, hip: bool = False) -> Iterator[None]:
    """Switch overlap_utils' import-time platform flags to CUDA (or HIP) for one run."""
    saved = (overlap_utils._is_cuda, overlap_utils._is_hip)
    overlap_utils._is_cuda, overlap_utils._is_hip = not hip, hip
    try:
        yield
    finally:
        overlap_utils._is_cuda, overlap_utils._is_hip = saved
