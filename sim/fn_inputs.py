"""Which inputs an op's function never reads, from its bytecode.

An op's function receives a private snapshot of every buffer it reads (the whole buffer, as
it was when the op started: :mod:`overlap_harness.sim.op_values`). A protocol often declares
a read only to order the op (``lambda r2t: None``, ``lambda v, fo: take_rows(v, keep)``), and a
snapshot nobody looks at is a whole-buffer copy for nothing. A parameter that the function's
code never loads cannot be seen, changed or kept by it, so the value engine may pass the
buffer's live memory there instead of a copy: the function computes the same results.

The test is on the code object, so it is exact and general: a positional parameter of a plain
Python function is unread when no instruction loads or deletes it, no nested function
captures it (it is not a cell variable) and the function names none of the builtins that
expose a frame's locals (``locals``, ``vars``, ``eval``, ``exec``, ``sys._getframe``,
``inspect.currentframe``). Anything else (a builtin, a ``functools.partial``, a callable
object, a parameter reached through ``*args``) counts as reading all its inputs. One scan per
code object, cached: the lambdas of one protocol line share theirs.

What the test cannot see is code outside the function that reaches into its frame (a helper
it calls that reads ``sys._getframe(1).f_locals``, a handler walking a traceback's frames):
that code would find the live memory, not a copy. No function of the harness does that.
"""

from __future__ import annotations

import dis
from types import CodeType, FunctionType
from typing import Any

# names through which a function can reach its own frame's locals without loading them
_INTROSPECTION = frozenset({"locals", "vars", "eval", "exec", "_getframe", "currentframe",
                            "f_locals"})

_UNREAD: dict[CodeType, tuple[bool, ...]] = {}


def unread_inputs(fn: Any) -> tuple[bool, ...]:
    """Per positional parameter of ``fn``, in order: True where its code never reads it.
    Empty when every parameter may be read (or ``fn`` is not a plain Python function)."""
    if type(fn) is not FunctionType:
        return ()
    code = fn.__code__
    flags = _UNREAD.get(code)
    if flags is None:
        flags = _UNREAD[code] = _scan(code)
    return flags


def _scan(code: CodeType) -> tuple[bool, ...]:
    """The flags of :func:`unread_inputs` for one code object (empty when none is unread)."""
    if _INTROSPECTION.intersection(code.co_names):
        return ()
    params = code.co_varnames[:code.co_argcount]
    read = set(code.co_cellvars)  # captured by a nested function
    for ins in dis.get_instructions(code):
        if ins.opname.startswith(("LOAD", "DELETE")) or ins.opname in ("MAKE_CELL",
                                                                        "STORE_FAST_LOAD_FAST"):
            value = ins.argval
            if isinstance(value, tuple):  # a combined instruction naming two locals
                read.update(v for v in value if isinstance(v, str))
            elif isinstance(value, str):
                read.add(value)
    flags = tuple(name not in read for name in params)
    return flags if any(flags) else ()
