"""The Triton kernels of SGLang's unified memory pool, declared to the recorder.

The unified pool's allocator binds and unbinds virtual pages in its page tables
(``virtual_slot.py``: ``alloc_bind_inplace``, ``bind_inplace``, ``free_unbind_inplace``),
translates virtual token ids to physical ones (``translate_token_ids``), zeroes the page
envelopes it hands out (``zero_pages``) and moves live pages when it compacts
(``copy_pages``). Each launch touches its tensors through raw pointers, so no dispatch mode
sees its accesses: each kernel is declared here with what it reads and writes, read off the
kernel's own loads and stores (rows of the page tables, page envelopes of the pool's byte
buffer). Its values are computed by SGLang's own kernel, run by Triton's interpreter (the
CPU has no device to launch it on). Triton's launcher (``triton/runtime/jit.py``) is plumbing
to the recorder: a launch is reported at SGLang's line that launched the kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import overlap_harness.recorder as recorder
from overlap_harness.recorder.kernels import DeclaredAccess, reads, writes

VIRTUAL_SLOT = "sglang.kernels.ops.memory.virtual_slot"
ZERO_PAGES = "sglang.kernels.ops.kvcache.zero_pages"
COPY_PAGES = "sglang.kernels.ops.kvcache.copy_pages"


def _envelopes(words: torch.Tensor, page_words: int) -> torch.Tensor:
    """The pool buffer (viewed as words by the launcher) as one row per page envelope."""
    return words.view(-1, page_words)


def _zero_pages_accesses(result: Any, words: torch.Tensor, pages: torch.Tensor,
                         page_words: int, **launch: Any) -> list[DeclaredAccess]:
    return reads(pages) + writes(_envelopes(words, page_words), rows=pages)


def _copy_pages_accesses(result: Any, words: torch.Tensor, src_pages: torch.Tensor,
                         dst_pages: torch.Tensor, page_words: int, **launch: Any
                         ) -> list[DeclaredAccess]:
    count = launch["grid"][0]
    src, dst = src_pages[:count], dst_pages[:count]
    envelopes = _envelopes(words, page_words)
    return reads(src) + reads(dst) + reads(envelopes, rows=src) + writes(envelopes, rows=dst)


def _alloc_bind_accesses(result: Any, v_pages: torch.Tensor, v2p: torch.Tensor,
                         p2v: torch.Tensor, out_phys: torch.Tensor, n: int, start_phys: int,
                         **launch: Any) -> list[DeclaredAccess]:
    virtual, physical = v_pages[:n], out_phys[:n]
    return (reads(virtual) + writes(physical) + writes(v2p, rows=virtual)
            + writes(p2v, rows=physical))


def _free_unbind_accesses(result: Any, v_pages: torch.Tensor, v2p: torch.Tensor,
                          p2v: torch.Tensor, out_phys: torch.Tensor, n: int, **launch: Any
                          ) -> list[DeclaredAccess]:
    virtual, physical = v_pages[:n], out_phys[:n]  # out_phys: the pages it read from v2p
    return (reads(virtual) + reads(v2p, rows=virtual) + writes(physical)
            + writes(v2p, rows=virtual) + writes(p2v, rows=physical))


def _bind_accesses(result: Any, v_pages: torch.Tensor, p_pages: torch.Tensor,
                   v2p: torch.Tensor, p2v: torch.Tensor, n: int, **launch: Any
                   ) -> list[DeclaredAccess]:
    virtual, physical = v_pages[:n], p_pages[:n]
    return (reads(virtual) + reads(physical) + writes(v2p, rows=virtual)
            + writes(p2v, rows=physical))


def _translate_accesses(result: Any, loc: torch.Tensor, v2p: torch.Tensor, out: torch.Tensor,
                        n: int, width: int, num_v_pages: int, *strides: int, **launch: Any
                        ) -> list[DeclaredAccess]:
    if launch["STRIDED"] or launch["DCP_SIZE"] != 1:
        raise NotImplementedError("translate_token_ids: a strided or DCP launch is not "
                                  "declared (the driven variant makes neither)")
    ids = loc.reshape(-1)[:n].to(torch.int64)
    pages = torch.div(ids, launch["PAGE_SIZE"], rounding_mode="floor")
    keep = (ids >= 0) & (pages < num_v_pages)
    # an id it does not keep reads v2p's padding row 0
    read_pages = torch.where(keep, pages, torch.zeros_like(pages))
    return (reads(loc) + reads(v2p, rows=read_pages.to(v2p.device))
            + writes(out.reshape(-1)[:width]))


def _interpreted(kernel: Any) -> Callable[..., Any]:
    """SGLang's ``kernel`` run by Triton's interpreter, launched as its ``run`` is."""
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction(kernel.fn)

    @functools.wraps(kernel.fn)
    def run(*args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        return interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)
    return run


#: (module, kernel attribute, accesses)
KERNELS: tuple[tuple[str, str, Callable[..., list[DeclaredAccess]]], ...] = (
    (ZERO_PAGES, "_zero_pages_kernel", _zero_pages_accesses),
    (COPY_PAGES, "_copy_pages_kernel", _copy_pages_accesses),
    (VIRTUAL_SLOT, "alloc_bind_inplace_kernel", _alloc_bind_accesses),
    (VIRTUAL_SLOT, "free_unbind_inplace_kernel", _free_unbind_accesses),
    (VIRTUAL_SLOT, "bind_inplace_kernel", _bind_accesses),
    (VIRTUAL_SLOT, "translate_token_ids_kernel", _translate_accesses),
)


def declare() -> None:
    """Register the declarations (idempotent); they apply inside every recorder watch. A
    kernel the loaded release does not have is one it does not launch (any other launch is
    still listed as an op of unknown access)."""
    import importlib
    import importlib.util

    import triton.runtime.jit

    from overlap_harness.recorder.sites import not_user_code

    not_user_code(triton.runtime.jit.__file__)
    for module_name, attribute, accesses in KERNELS:
        if importlib.util.find_spec(module_name) is None:
            continue
        kernel = getattr(importlib.import_module(module_name), attribute, None)
        if kernel is None:
            continue
        recorder.declare_kernel(kernel, accesses, cpu_impl=_interpreted(kernel),
                                name=attribute.removesuffix("_kernel").lstrip("_"))
