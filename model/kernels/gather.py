"""The spec-extras gather: one index tensor, four row gathers (PROTOCOL.md §4).

Each decode iteration of spec-v2 reads back, for the ``m`` rows of the batch, what the previous
iteration stashed: the draft top-k probabilities and ids, the bonus token, and (when the draft
model needs them) the hidden states. All four are row gathers by the same ``indices``.

Three implementations sit behind :func:`gather_spec_extras`, chosen by the scenario key
``protocol.gather`` (:class:`model.config.Gather`):

* ``unfused``: four advanced-indexing ops, the reference. Four launches on a GPU.
* ``fused``: ``torch.compile(dynamic=True)`` of that same function (SGLang #26129). Compiled
  lazily, once per process and dtype set; :func:`fused_compile_count` counts the graphs the
  compiler actually built, so "no recompilation as m changes" is measured, not assumed.
  Compiled where it is the subject: on CUDA, or on the CPU when asked
  (:func:`set_cpu_compile` or ``OVERLAP_HARNESS_COMPILE_GATHER=1``). Otherwise, and when the
  CPU has no C++ compiler for Inductor or the compile fails, the same function runs eagerly
  (the same values; one launch in the model either way) after a one-line note on stderr. So
  the CPU simulation needs no C++ compiler and pays no compile (about 8 s cold per process,
  then 6.4 ms of OpenMP work per call on a busy machine against 18-42 us eager: issue 17).
* ``triton``: one Triton launch doing all four gathers (the idea of #27233, written here from
  the description): grid (m, ceil(max_row_width / BLOCK)). CUDA only; Triton is imported lazily.

All three return fresh, contiguous tensors. Indices must lie in ``[0, P)``: the torch versions
raise (CPU) or device-assert (CUDA) on a bad index; the Triton one does not check.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from overlap_harness.model.config import Gather
from overlap_harness.model.errors import HarnessError

__all__ = [
    "GatherImplError",
    "SpecExtras",
    "TritonUnavailableError",
    "available_impls",
    "cpu_compile_enabled",
    "eager_reason",
    "fallback_impl",
    "fused_compile_count",
    "gather_spec_extras",
    "reset_fused_gather",
    "set_cpu_compile",
]

COMPILE_ENV = "OVERLAP_HARNESS_COMPILE_GATHER"
"""Set to 1 to compile the fused gather on the CPU too (it needs a C++ compiler there)."""

_log = logging.getLogger("overlap_harness.kernels")


class GatherImplError(HarnessError):
    """An unknown gather implementation was asked for."""


class TritonUnavailableError(GatherImplError):
    """The Triton gather (or a compiled CUDA gather) was asked for where it cannot run."""


class SpecExtras(NamedTuple):
    """What the gather returns for ``m`` rows; ``hidden_states`` is None when not captured."""

    topk_p: torch.Tensor  # (m, k), topk_p_buf's dtype
    topk_index: torch.Tensor  # (m, k) int64
    bonus_tokens: torch.Tensor  # (m,), output_tokens_buf's dtype
    hidden_states: torch.Tensor | None  # (m, H) or None


def _gather_unfused(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The reference: four advanced-indexing gathers. Also the function that ``fused`` compiles."""
    topk_p = topk_p_buf[indices]
    topk_index = topk_index_buf[indices]
    bonus_tokens = output_tokens_buf[indices]
    hidden = hidden_states_buf[indices] if hidden_states_buf is not None else None
    return topk_p, topk_index, bonus_tokens, hidden


# --- fused: torch.compile(dynamic=True), compiled lazily once per process ---------------------

_fused_fn: Callable[..., Any] | None = None
_compile_count = 0
_cpu_compile: bool | None = None  # None: read COMPILE_ENV
_eager_reason: str | None = None  # why the CPU runs it eagerly, once known
_noted = False


def _counting_inductor(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A torch.compile backend that counts each graph it is handed, then runs Inductor on it.

    Dynamo calls the backend once per graph it captures, i.e. once per (re)compilation, so this
    counter is the number of compilations, read off the compiler itself.
    """
    global _compile_count
    _compile_count += 1
    return torch._dynamo.lookup_backend("inductor")(gm, example_inputs)


def _fused() -> Callable[..., Any]:
    global _fused_fn
    if _fused_fn is None:
        _fused_fn = torch.compile(_gather_unfused, dynamic=True, backend=_counting_inductor)
    return _fused_fn


def set_cpu_compile(enabled: bool | None) -> None:
    """Compile the fused gather on the CPU (True), run it eagerly there (False), or follow
    ``OVERLAP_HARNESS_COMPILE_GATHER`` (None, the default). CUDA always compiles it."""
    global _cpu_compile, _eager_reason, _noted
    _cpu_compile, _eager_reason, _noted = enabled, None, False


def cpu_compile_enabled() -> bool:
    """Whether the fused gather is asked to compile on the CPU (see :func:`set_cpu_compile`)."""
    if _cpu_compile is not None:
        return _cpu_compile
    return os.environ.get(COMPILE_ENV, "").strip() not in ("", "0")


def _cpp_compiler_missing() -> str | None:
    """Why Inductor cannot build CPU code here (no C++ compiler), or None when it can.

    Inductor looks for ``config.cpp.cxx`` (``CXX`` or g++) and raises when none is found; we
    ask it the same question before compiling, so the answer is one line, not a traceback.
    """
    # deferred: torch._inductor is heavy and only a CPU compile needs it
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as exc:  # any failure of the search means "no compiler"
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"no C++ compiler for Inductor ({type(exc).__name__}: {first[:120]})"
    return None


def _note_eager(reason: str) -> None:
    """One line on stderr, once per process, the first time the CPU runs the gather eagerly."""
    global _noted, _eager_reason
    _eager_reason = reason
    if not _noted:
        _noted = True
        _log.warning("overlap-harness: note: the fused gather runs uncompiled on the CPU, "
                     "same values (%s)", reason)


def eager_reason() -> str | None:
    """Why the fused gather last ran uncompiled on the CPU in this process, or None."""
    return _eager_reason


def _fused_on_cpu(args: tuple[torch.Tensor | None, ...]) -> tuple[Any, ...]:
    """The fused gather on the CPU: compiled when asked and possible, else eager with a note."""
    if not cpu_compile_enabled():
        _note_eager(f"compiled only on a GPU or with {COMPILE_ENV}=1")
        return _gather_unfused(*args)
    if _eager_reason is None and (missing := _cpp_compiler_missing()) is not None:
        _note_eager(missing)
    if _eager_reason is not None:
        return _gather_unfused(*args)
    try:
        return _fused()(*(_unbacked_alias(t) for t in args))
    except (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.InductorError) as exc:
        _note_eager(f"compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return _gather_unfused(*args)


def _unbacked_alias(t: torch.Tensor | None) -> torch.Tensor | None:
    """An alias of ``t`` with every size marked unbacked, so no size is specialized.

    ``dynamic=True`` alone still specializes sizes 0 and 1, so m = 1 (batch size 1) and m = 0
    (an idle DP rank) would each cost a recompile. The mark goes on a fresh alias, not on the
    caller's tensor, so other compiled code that sees the caller's buffers is not affected.
    """
    if t is None:
        return None
    alias = t.detach()  # shares storage but has no ``_base``, whose sizes Dynamo would guard
    for dim in range(alias.dim()):
        torch._dynamo.decorators.mark_unbacked(alias, dim)
    return alias


def fused_compile_count() -> int:
    """How many graphs the fused gather's compiler has built in this process (measured)."""
    return _compile_count


def reset_fused_gather() -> None:
    """Forget the compiled fused gather and zero its counter (for tests and benchmarks).

    This calls ``torch._dynamo.reset()``, which drops every compiled function in the process.
    """
    global _fused_fn, _compile_count, _eager_reason
    torch._dynamo.reset()
    _fused_fn = None
    _compile_count = 0
    _eager_reason = None


# --- triton: one launch for all four gathers ---------------------------------------------------

_triton_kernel_fn: Any = None
triton: Any = None  # bound by _triton_kernel(); never imported at module import
tl: Any = None


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_kernel() -> Any:
    """Import Triton and build the kernel on first use (``model`` must import without Triton)."""
    global _triton_kernel_fn, triton, tl
    if _triton_kernel_fn is not None:
        return _triton_kernel_fn
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise TritonUnavailableError(
            "gather impl 'triton' needs the triton package, which is not installed; "
            f"use one of {available_impls('cpu')}"
        ) from exc

    @triton.jit
    def _spec_extras_kernel(
        idx_ptr,
        p_src, p_s0, p_s1, p_dst,
        i_src, i_s0, i_s1, i_dst, k,
        o_src, o_s0, o_dst,
        h_src, h_s0, h_s1, h_dst, H,
        HAS_HIDDEN: tl.constexpr,
        BLOCK: tl.constexpr,
    ):  # fmt: skip
        # Program (row, blk) copies columns [blk*BLOCK, (blk+1)*BLOCK) of source row
        # indices[row] of every buffer into output row `row`; masks cut each buffer's width.
        row = tl.program_id(0).to(tl.int64)
        src = tl.load(idx_ptr + row).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_k = cols < k
        tl.store(
            p_dst + row * k + cols, tl.load(p_src + src * p_s0 + cols * p_s1, mask=in_k), mask=in_k
        )
        tl.store(
            i_dst + row * k + cols, tl.load(i_src + src * i_s0 + cols * i_s1, mask=in_k), mask=in_k
        )
        first = cols < 1  # the bonus token is one column: only block 0, lane 0 copies it
        tl.store(o_dst + row + cols, tl.load(o_src + src * o_s0 + cols, mask=first), mask=first)
        if HAS_HIDDEN:
            in_h = cols < H
            tl.store(
                h_dst + row * H + cols,
                tl.load(h_src + src * h_s0 + cols * h_s1, mask=in_h),
                mask=in_h,
            )

    _triton_kernel_fn = _spec_extras_kernel
    return _triton_kernel_fn


def _empty_like_rows(buf: torch.Tensor, m: int) -> torch.Tensor:
    return torch.empty((m, *buf.shape[1:]), dtype=buf.dtype, device=buf.device)


def _gather_triton(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if not indices.is_cuda:
        raise TritonUnavailableError(
            f"gather impl 'triton' runs on CUDA only, got indices on {indices.device}; "
            f"use one of {available_impls(indices.device)}"
        )
    kernel = _triton_kernel()
    m = indices.shape[0]
    outs = (
        _empty_like_rows(topk_p_buf, m),
        _empty_like_rows(topk_index_buf, m),
        _empty_like_rows(output_tokens_buf, m),
        _empty_like_rows(hidden_states_buf, m) if hidden_states_buf is not None else None,
    )
    if m == 0:
        return outs
    k = topk_p_buf.shape[1]
    if topk_index_buf.shape[1] != k:
        raise GatherImplError(
            f"topk_p_buf has {k} columns but topk_index_buf has {topk_index_buf.shape[1]}"
        )
    h = hidden_states_buf
    width = max(k, 1, h.shape[1] if h is not None else 0)
    block = min(triton.next_power_of_2(width), 1024)
    p_out, i_out, o_out, h_out = outs
    # Without hidden states the kernel never touches h_*; any valid pointer will do.
    h_src, h_dst = (h, h_out) if h is not None else (p_out, p_out)
    kernel[(m, triton.cdiv(width, block))](
        indices.contiguous(),
        topk_p_buf, topk_p_buf.stride(0), topk_p_buf.stride(1), p_out,
        topk_index_buf, topk_index_buf.stride(0), topk_index_buf.stride(1), i_out, k,
        output_tokens_buf, output_tokens_buf.stride(0), o_out,
        h_src, h_src.stride(0), h_src.stride(1), h_dst,
        h.shape[1] if h is not None else 0,
        HAS_HIDDEN=h is not None,
        BLOCK=block,
    )  # fmt: skip
    return outs


# --- the one public entry point ---------------------------------------------------------------


def _device_type(device: torch.device | str) -> str:
    return torch.device(device).type


def available_impls(device: torch.device | str) -> tuple[str, ...]:
    """The gather implementations that can run on ``device``, reference first.

    ``unfused`` runs anywhere. ``fused`` runs on any CPU (compiled only when asked and a C++
    compiler is there, else eagerly) and on CUDA with Triton (Inductor's backend there).
    ``triton`` needs CUDA and Triton.
    """
    if _device_type(device) == "cuda":
        if _triton_importable():
            return (Gather.UNFUSED.value, Gather.FUSED.value, Gather.TRITON.value)
        return (Gather.UNFUSED.value,)
    return (Gather.UNFUSED.value, Gather.FUSED.value)


def fallback_impl(requested: str, device: torch.device | str) -> str:
    """The fallback rule: ``requested`` if it runs on ``device``, else ``fused``, else ``unfused``.

    :func:`gather_spec_extras` itself never falls back (it raises); a caller that prefers to
    degrade calls this first, so the substitution is explicit and can be logged.
    """
    wanted = _parse_impl(requested).value
    usable = available_impls(device)
    if wanted in usable:
        return wanted
    return Gather.FUSED.value if Gather.FUSED.value in usable else Gather.UNFUSED.value


def _parse_impl(impl: str) -> Gather:
    try:
        return Gather(impl)
    except ValueError:
        choices = "|".join(g.value for g in Gather)
        raise GatherImplError(f"gather impl: expected one of {choices}, got {impl!r}") from None


def gather_spec_extras(
    indices: torch.Tensor,
    topk_p_buf: torch.Tensor,
    topk_index_buf: torch.Tensor,
    output_tokens_buf: torch.Tensor,
    hidden_states_buf: torch.Tensor | None,
    impl: str = "fused",
) -> SpecExtras:
    """Gather rows ``indices`` of the four relay buffers with implementation ``impl``.

    Args:
        indices: (m,) int64 row ids, each in [0, P); m may be 0.
        topk_p_buf: (P, k) draft top-k probabilities.
        topk_index_buf: (P, k) int64 draft top-k token ids.
        output_tokens_buf: (P,) int64 bonus tokens.
        hidden_states_buf: (P, H) draft hidden states, or None when they are not captured.
        impl: ``"unfused"`` | ``"fused"`` | ``"triton"`` (the scenario key ``protocol.gather``).

    Returns:
        :class:`SpecExtras` of fresh tensors; ``hidden_states`` is None iff its buffer is.

    Raises:
        GatherImplError: ``impl`` is not one of the three names.
        TritonUnavailableError: ``triton`` off CUDA or without Triton, or ``fused`` on CUDA
            without Triton (Inductor needs it there).
    """
    which = _parse_impl(impl)
    if which is Gather.UNFUSED:
        return SpecExtras(
            *_gather_unfused(
                indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf
            )
        )
    if which is Gather.TRITON:
        return SpecExtras(
            *_gather_triton(
                indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf
            )
        )
    if indices.is_cuda and not _triton_importable():
        raise TritonUnavailableError(
            "gather impl 'fused' on CUDA compiles through Inductor, which needs triton; "
            "use 'unfused'"
        )
    args = (indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf)
    if not indices.is_cuda:
        return SpecExtras(*_fused_on_cpu(args))
    return SpecExtras(*_fused()(*(_unbacked_alias(t) for t in args)))
