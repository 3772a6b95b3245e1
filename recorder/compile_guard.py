"""The dispatch mode's hook kept out of torch.compile without importing ``torch._dynamo``.

PyTorch wraps a ``TorchDispatchMode`` subclass's ``__torch_dispatch__`` in
``torch._disable_dynamo`` when the class is made (torch/utils/_python_dispatch.py,
``TorchDispatchMode.__init_subclass__``, when ``_should_skip_dynamo()`` is true), and that
wrapper imports ``torch._dynamo`` on its first call (torch/_compile.py) - with sympy and parts
of torch.distributed, about a second of CPU, as much as a small watched program costs.

The wrapper's purpose is that Dynamo never compiles the hook's frame nor anything it calls.
Dynamo decides per code object what to do with a frame, and a code object can carry that
decision itself: ``torch._C._dynamo.eval_frame.set_code_exec_strategy`` with the action
``SKIP`` for the frame and ``SKIP`` for every frame it calls (what ``torch._dynamo`` records
for a code it gives up on; torch/_dynamo/types.py, ``FrameExecStrategy``). That lives in
``torch._C``, so :func:`skipped_by_dynamo` marks the hook's wrapper that way when the class is
made, and nothing is imported until a program itself uses torch.compile.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

try:
    from torch._C._dynamo.eval_frame import (
        _FrameAction,
        _FrameExecStrategy,
        set_code_exec_strategy,
    )
except ImportError:  # a torch without per-code strategies: keep torch's own wrapper
    set_code_exec_strategy = None


def skipped_by_dynamo(method: F) -> F:
    """``method`` run by a wrapper that Dynamo skips, with every frame it calls (see the module
    doc); where this torch cannot mark a code object, torch's own lazy ``_disable_dynamo``."""
    if set_code_exec_strategy is None:
        return torch._disable_dynamo(method, recursive=True)  # type: ignore[return-value]

    @functools.wraps(method)
    def run(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    set_code_exec_strategy(run.__code__,
                           _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))
    return run  # type: ignore[return-value]
