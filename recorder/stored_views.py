"""Is a NumPy view about to be the value of a subscript assignment into a plain array?

``plain[:n] = host[:n]``: NumPy copies the source into a plain (unwatched) array in C, without
calling any Python method of the source, so :class:`recorder.host_arrays.HostArray` never
sees that read. What it does see is the view being taken (``host[:n]``, its
``__getitem__``). This module reads the statement around that call from its bytecode: when
the value just taken is next stored by ``container[key] = value`` (``STORE_SUBSCR``, or
``STORE_SLICE`` on Python 3.12+), the container is evaluated where its expression is a
name with attributes (``dst``, ``self.buf.np``) and the store is reported when it is a plain
ndarray (a ``HostArray`` records the read itself); an expression it cannot evaluate without
running the program's code (``bufs[i][:n] = ...``) is reported too, as a read of the view
(conservative: a list or dict given the view would not read it).

Facts this builds on (CPython's ``dis``): the value of ``X[k] = v`` is evaluated first and
stays under ``X`` and ``k`` on the stack until the store; the container's and key's code
never pops below its own pushes. Only straight-line code is followed (a jump ends the scan).
Not seen: a bare watched array as the value (``plain[:n] = host``: no Python call at all)
and a view used as an index array of a plain array (``plain[host[:n]]``).
"""

from __future__ import annotations

import dis
import types
from typing import Any

_TAKES = {"BINARY_SUBSCR", "BINARY_SLICE", "BINARY_OP"}  # how ``host[...]`` was evaluated
_STORES = {"STORE_SUBSCR": 3, "STORE_SLICE": 4}  # the value's depth when it is stored
_NAME_LOADS = {"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_NAME", "LOAD_GLOBAL",
               "LOAD_DEREF"}
# Python 3.13+ loads two locals in one instruction (``dst[i] = ...``: the container and key)
_PAIR_LOADS = {"LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"}
_ENDS = set(dis.hasjrel) | set(dis.hasjabs)

# (code, offset) -> None (not stored), () (stored, container not evaluable) or
# (load opname, name, attribute names)
_CACHE: dict[tuple[types.CodeType, int], tuple[str, ...] | tuple[()] | None] = {}
_NOT_STORED = "not stored"


def _instructions(code: types.CodeType) -> list[dis.Instruction]:
    return list(dis.get_instructions(code))


def _container(code: types.CodeType, offset: int) -> Any:
    """What the cache holds for the value pushed by the instruction at ``offset``."""
    key = (code, offset)
    if key not in _CACHE:
        _CACHE[key] = _scan(code, offset)
    return _CACHE[key]


def _scan(code: types.CodeType, offset: int) -> tuple[str, ...] | tuple[()] | None:
    instructions = _instructions(code)
    start = next((i for i, ins in enumerate(instructions) if ins.offset == offset), None)
    if start is None or instructions[start].opname not in _TAKES:
        return None
    depth = 1  # the view, on top of the stack
    container_end = None
    for index in range(start + 1, len(instructions)):
        ins = instructions[index]
        if ins.opname in _STORES and depth == _STORES[ins.opname]:
            if container_end is None:
                return None
            return _simple(instructions[start + 1:container_end + 1])
        if ins.opcode in _ENDS or ins.opname.startswith(("RETURN", "RAISE", "YIELD")):
            return None
        if ins.opname == "CACHE":
            continue
        if depth == 1 and not ins.opname.startswith("LOAD"):
            return None  # the view itself is consumed by this instruction
        try:
            depth += dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT
                                      else None, jump=False)
        except ValueError:  # an instruction ``dis`` has no stack effect for: stop here
            return None
        if depth < 2:
            return None
        if depth == 2 or (depth == 3 and ins.opname in _PAIR_LOADS and index == start + 1):
            container_end = index  # the container's expression ends here (so far)
    return None


def _simple(container_code: list[dis.Instruction]) -> tuple[str, ...] | tuple[()]:
    """``(load, name, attr, ...)`` for ``name.attr...``, else ``()`` (not evaluable)."""
    first, rest = container_code[0], container_code[1:]
    if first.opname in _PAIR_LOADS and not rest:
        return ("LOAD_FAST", str(first.argval[0]))
    if first.opname not in _NAME_LOADS or any(ins.opname != "LOAD_ATTR" for ins in rest):
        return ()
    return (first.opname, str(first.argval), *(str(ins.argval) for ins in rest))


def stored_into(frame: types.FrameType) -> tuple[bool, Any]:
    """Whether the value ``frame`` just pushed (its instruction at ``f_lasti``) is stored by a
    subscript assignment next, and into what: ``(True, container)``, ``(True, None)`` where
    the container is not evaluable, ``(False, None)`` when the value is not stored so."""
    found = _container(frame.f_code, frame.f_lasti)
    if found is None:
        return False, None
    if not found:
        return True, None
    load, name, *attributes = found
    scopes = ([frame.f_globals, frame.f_builtins] if load == "LOAD_GLOBAL"
              else [frame.f_locals, frame.f_globals, frame.f_builtins])
    for scope in scopes:
        if name in scope:
            value = scope[name]
            break
    else:
        return True, None
    try:
        for attribute in attributes:
            value = getattr(value, attribute)
    except Exception:  # the store itself raises it
        return True, None
    return True, value
