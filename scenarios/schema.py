"""What the scenario dataclasses declare, read generically for the loader and the key reference.

``model.config`` declares one frozen dataclass per TOML table; this module answers the
questions both ``scenarios.loader`` (validation) and ``scenarios.keyref`` (documentation) ask
of a field: which keys a table has, what kind of value a key takes, its choices or range.
Keeping the answers in one place is what keeps the reference page and the validator in step:
a field added to ``model.config`` is validated and documented with no change here.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from enum import Enum
from functools import cache
from typing import Any

from overlap_harness.model.config import Mutation, ProtocolConfig
from overlap_harness.model.device import SyncLabel

#: A ``dict`` field whose keys are an optional subset of another table's keys, validated like
#: that table (``mutation.set`` holds protocol overrides).
PARTIAL_TABLES: dict[tuple[type, str], type] = {(Mutation, "set"): ProtocolConfig}

#: The race kinds a ``check.races`` / ``mutation.races`` entry may name ("KIND buffer").
RACE_KINDS: tuple[str, ...] = ("RAW", "WAR", "WAW", "host-D2H", "reuse")

#: Valid ``mutation.remove`` entries.
SYNC_LABELS: tuple[str, ...] = tuple(label.value for label in SyncLabel)


@cache
def user_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """The (field, resolved type) pairs of a table that a scenario file may set.

    Fields marked ``metadata["internal"]`` (``Scenario.path``) are set by the loader, not
    by files, and are left out.
    """
    hints = typing.get_type_hints(cls)
    return tuple(
        (f, hints[f.name]) for f in dataclasses.fields(cls) if not f.metadata.get("internal")
    )


def all_fields(cls: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """Every (field, resolved type) pair of a table, internal ones included."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls))


def is_enum(tp: Any) -> bool:
    """Whether ``tp`` is an Enum class (a key with fixed choices)."""
    return isinstance(tp, type) and issubclass(tp, Enum)


def is_table(tp: Any) -> bool:
    """Whether ``tp`` is a nested table (a config dataclass)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def element_type(tp: Any) -> Any | None:
    """The element type of an array type ``tuple[X, ...]``, or None if ``tp`` is no array."""
    if typing.get_origin(tp) is tuple:
        return typing.get_args(tp)[0]
    return None


def choices(tp: Any) -> str:
    """An enum's choices as the loader prints them: ``none|loop_top|read_done``."""
    return "|".join(str(member.value) for member in tp)


def type_name(tp: Any, article: bool = True) -> str:
    """How a key's type reads in an error message ("an integer") or the reference ("integer")."""
    names = {int: ("an integer", "integer"), float: ("a number", "float"),
             bool: ("true or false", "boolean"), str: ("a string", "string"),
             dict: ("a table", "table")}
    if tp in names:
        return names[tp][0 if article else 1]
    if is_enum(tp):
        return f"one of {choices(tp)}" if article else "string (choice)"
    if is_table(tp):
        return "a table" if article else "table"
    elem = element_type(tp)
    if elem is not None:
        inner = "tables" if is_table(elem) else type_name(elem, article=False) + "s"
        return f"an array of {inner}" if article else f"array of {inner}"
    return repr(tp)


def show(value: Any) -> str:
    """A TOML value as an error message quotes it: strings quoted, true/false, arrays named."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def key_path(prefix: str, key: str) -> str:
    """Join a key path: ``protocol`` + ``topk``; keys that are not bare TOML keys get quoted."""
    bare = key != "" and all(ch.isalnum() or ch in "_-" for ch in key) and key.isascii()
    part = key if bare else json.dumps(key, ensure_ascii=False)
    return f"{prefix}.{part}" if prefix else part
