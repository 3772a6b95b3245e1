"""Read scenario TOML files into ``model.config.Scenario`` values, rejecting bad input.

One pass over each file, driven by the dataclasses in ``model.config`` (their fields, type
hints and ``metadata["range"]``), so a field added there is checked here with no change:
unknown keys (with a "did you mean"), wrong types, enum choices, ranges, nested tables and
arrays of tables, then the cross-field rules of ``scenarios.rules``. Every problem of every
file is collected before anything is raised, one line each::

    scenarios/x.toml: protocol.war_barrier: expected one of none|loop_top|read_done|...

The path is printed as the caller gave it. A file whose ``name`` is missing is named after
the file (its stem).
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from overlap_harness.model.config import Scenario
from overlap_harness.model.errors import ScenarioError
from overlap_harness.scenarios.buffers import check_race_buffers
from overlap_harness.scenarios.locate import KeyLocator
from overlap_harness.scenarios.rules import Problems, check_runnable, check_scenario
from overlap_harness.scenarios.schema import (
    PARTIAL_TABLES,
    element_type,
    is_enum,
    is_table,
    key_path,
    show,
    type_name,
    user_fields,
)

_BAD = object()  # a value that failed its check (the problem is already recorded)
_INDEX = re.compile(r"\[\d+\]")
#: Deepest bracket nesting a file may have. The schema needs 3 (``[[mutation]]`` holding
#: ``set = {...}``); tomllib recurses once per level, so a file nested thousands deep would
#: end in a RecursionError. The limit leaves room for any scenario and stops that early.
MAX_NESTING = 32
_UTF8_BOM = b"\xef\xbb\xbf"
_TOML_WHERE = re.compile(r"^(?P<msg>.*) \((?:at line (?P<line>\d+), column (?P<col>\d+)|"
                         r"at end of document)\)$")


def load_scenario(path: str | Path, *, runnable: bool = False) -> Scenario:
    """Load and validate one scenario file.

    Raises ``ScenarioError`` listing every problem of the file (unreadable, bad TOML, bad
    keys or values, impossible combinations; with ``runnable``, also a scenario with nothing
    to run, which the commands that run scenarios ask for so it cannot pass silently).
    """
    lines: list[str] = []
    scenario = _load_file(Path(path), str(path), lines, runnable)
    if lines or scenario is None:
        raise ScenarioError(lines or [f"{path}: could not be loaded"])
    return scenario


def load_paths(paths: Iterable[str | Path], *, runnable: bool = False) -> list[Scenario]:
    """Load a suite: files, and folders searched recursively for ``*.toml`` (sorted).
    ``runnable`` as for :func:`load_scenario`.

    A file reached twice (named and inside a named folder) is loaded once. Raises
    ``ScenarioError`` with every problem across all files: missing paths, folders without
    scenario files, per-file problems, and scenario names used by more than one file.
    """
    lines: list[str] = []
    files = _collect(paths, lines)
    if not files and not lines:
        lines.append("no scenario files given")
    scenarios: list[Scenario] = []
    for file, shown in files:
        scenario = _load_file(file, shown, lines, runnable)
        if scenario is not None:
            scenarios.append(scenario)
    first: dict[str, Scenario] = {}
    for s in scenarios:
        if s.name in first:
            Problems(s.path, lines, _locator(Path(s.path))).add(
                "name", f"{show(s.name)} is already the name of {first[s.name].path}; "
                        "scenario names must be unique in a suite")
        else:
            first[s.name] = s
    if lines:
        raise ScenarioError(lines)
    return scenarios


def _locator(file: Path) -> Callable[[str], int | None] | None:
    """The key-path-to-line function of a file loaded before (None if it cannot be read)."""
    try:
        return KeyLocator(file.read_text(encoding="utf-8")).line
    except (OSError, UnicodeDecodeError):
        return None


def _collect(paths: Iterable[str | Path], lines: list[str]) -> list[tuple[Path, str]]:
    """The files to load, each with the path to print, in order, without repeats."""
    found: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for given in paths:
        p = Path(given)
        if p.is_dir():
            inside = sorted(f for f in p.rglob("*.toml") if f.is_file())
            if not inside:
                lines.append(f"{given}: folder holds no .toml scenario files")
            candidates = [(f, str(f)) for f in inside]
        elif p.exists():
            candidates = [(p, str(given))]
        else:
            lines.append(f"{given}: {_missing(p)}")
            candidates = []
        if p.is_dir():
            lines += [f"{f}: {_missing(f)}" for f in sorted(p.rglob("*.toml"))
                      if f.is_symlink() and not f.exists()]
        for f, shown in candidates:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                found.append((f, shown))
    return found


def _missing(path: Path) -> str:
    """Why a path that does not exist cannot be read: no such file, a symbolic link loop, or
    a link to a missing target (``Path.exists`` says False for all three)."""
    if not path.is_symlink():
        return "no such file or folder"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop (the link leads back to itself); point it at a file"
    return f"symbolic link to {os.readlink(path)}, which does not exist"


def _load_file(file: Path, shown: str, lines: list[str], runnable: bool) -> Scenario | None:
    """Parse and check one file; its problems go to ``lines``. None if it cannot be built.
    ``runnable`` adds :func:`~scenarios.rules.check_runnable`."""
    raw = _read(file, shown, lines)
    if raw is None:
        return None
    out = Problems(shown, lines, KeyLocator(file.read_text(encoding="utf-8")).line)
    values = _keys(raw, Scenario, "", out)
    values.setdefault("name", file.stem)
    scenario = Scenario(**values, path=shown)
    if scenario.profile and not (file.parent / scenario.profile).is_file():
        out.add("profile", f"{show(scenario.profile)}: no such profile file (looked for "
                           f"{file.parent / scenario.profile}); run `overlap-harness "
                           "calibrate` on a GPU to make one, or give --profile")
    check_scenario(scenario, out)
    check_race_buffers(scenario, out)
    if runnable:
        check_runnable(scenario, out)
    return scenario


def _read(file: Path, shown: str, lines: list[str]) -> dict[str, Any] | None:
    """The parsed TOML of ``file``, or None with its problem added to ``lines``.

    Checked before parsing: readable, no byte-order mark (TOML forbids it and tomllib would
    call it an "Invalid statement"), UTF-8, nesting depth (see :data:`MAX_NESTING`)."""
    try:
        data = file.read_bytes()
    except IsADirectoryError:
        lines.append(f"{shown}: is a folder, not a scenario file")
        return None
    except OSError as exc:
        lines.append(f"{shown}: cannot read: {exc.strerror or exc}")
        return None
    if data.startswith(_UTF8_BOM):
        lines.append(f"{shown}: line 1: starts with a UTF-8 byte-order mark (BOM), which TOML "
                     "does not allow; save the file as UTF-8 without BOM")
        return None
    try:
        text = data.decode("utf-8")
        deep = _too_deep(text, MAX_NESTING)
        if deep is not None:
            lines.append(f"{shown}: line {deep}: arrays or tables nested more than "
                         f"{MAX_NESTING} deep; a scenario needs at most 3")
            return None
        return tomllib.loads(text)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        lines.append(f"{shown}: line {line}: not UTF-8 text (byte {exc.start}); save it as "
                     "UTF-8")
    except RecursionError:  # a nesting _too_deep missed (it does not parse TOML fully)
        lines.append(f"{shown}: arrays or tables nested too deep for the TOML reader")
    except tomllib.TOMLDecodeError as exc:
        m = _TOML_WHERE.match(str(exc))
        if m is None:
            lines.append(f"{shown}: TOML syntax error: {exc}")
        elif m["line"]:
            lines.append(f"{shown}: line {m['line']}, column {m['col']}: "
                         f"TOML syntax error: {m['msg']}")
        else:
            lines.append(f"{shown}: end of file: TOML syntax error: {m['msg']}")
    return None


def _too_deep(text: str, limit: int) -> int | None:
    """The line where bracket nesting (``[`` and ``{``, outside strings and comments) first
    exceeds ``limit``, or None. A scan, not a parse: brackets of table headers open and close
    on their line, so they count only briefly."""
    if text.count("[") + text.count("{") <= limit:
        return None
    depth, line, i, size = 0, 1, 0, len(text)
    while i < size:
        ch = text[i]
        if ch == "\n":
            line += 1
        elif ch == "#":
            end = text.find("\n", i)
            i = size if end < 0 else end
            continue
        elif ch in "\"'":
            quote = ch * 3 if text.startswith(ch * 3, i) else ch
            j = i + len(quote)
            while j < size and not text.startswith(quote, j):
                if len(quote) == 1 and text[j] == "\n":
                    break  # an unclosed one-line string: tomllib reports it
                j += 2 if ch == '"' and text[j] == "\\" else 1
            line += text.count("\n", i, j)
            i = j + len(quote)
            continue
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return line
        elif ch in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


def _keys(raw: dict[str, Any], cls: type, prefix: str, out: Problems) -> dict[str, Any]:
    """Check a TOML table against ``cls``'s fields; return the valid keys' converted values."""
    fields = {f.name: (f, tp) for f, tp in user_fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = key_path(prefix, key)
        if key not in fields:
            out.add(where, _unknown(cls, key, value, fields))
            continue
        f, tp = fields[key]
        partial = PARTIAL_TABLES.get((cls, key))
        if partial is not None and isinstance(value, dict):
            converted: Any = _keys(value, partial, where, out)
        elif partial is not None:
            out.add(where, f"expected a table of [{_table_name(partial)}] keys, "
                           f"got {show(value)}")
            continue
        else:
            converted = _convert(value, tp, where, out)
        if converted is _BAD:
            continue
        bounds = f.metadata.get("range")
        if bounds is not None and not bounds[0] <= converted <= bounds[1]:
            out.add(where, f"expected {bounds[0]}..{bounds[1]}, got {show(value)}")
            continue
        values[key] = converted
    return values


def _table_name(cls: type) -> str:
    """The TOML table a dataclass stands for (``ProtocolConfig`` -> ``protocol``)."""
    return next((f.name for f, tp in user_fields(Scenario) if tp is cls), cls.__name__)


def _unknown(cls: type, key: str, value: Any, fields: dict[str, Any]) -> str:
    """Why ``key`` is rejected, with the likeliest fix: a near spelling, the table the key
    belongs to, or the list of valid keys."""
    if any(f.name == key for f in dataclasses.fields(cls)):
        return "is set by the loader, not by the file; remove it"
    what = "unknown table" if isinstance(value, dict) else "unknown key"
    lowered = {name.lower(): name for name in fields}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1)
    if close:
        return f"{what}; did you mean {lowered[close[0]]}?"
    homes = [f"{f.name}.{key}" for f, tp in user_fields(Scenario)
             if is_table(tp) and tp is not cls and any(g.name == key for g, _ in user_fields(tp))]
    if homes:
        return f"{what}; did you mean {' or '.join(homes)}?"
    return f"{what}; valid keys: {', '.join(fields)}"


def _convert(value: Any, tp: Any, where: str, out: Problems) -> Any:
    """Check one value against a field type; the converted value, or ``_BAD``."""
    if is_table(tp):
        if isinstance(value, dict):
            return tp(**_keys(value, tp, where, out))
        out.add(where, f"expected a table, got {show(value)}")
        return _BAD
    elem = element_type(tp)
    if elem is not None:
        return _array(value, tp, elem, where, out)
    if is_enum(tp):
        if isinstance(value, str) and value in tp._value2member_map_:
            return tp(value)
        out.add(where, f"expected {type_name(tp)}, got {show(value)}")
        return _BAD
    if _fits(value, tp):
        return float(value) if tp is float else value
    if tp in (int, float, bool, str, dict):
        out.add(where, f"expected {type_name(tp)}, got {show(value)}{_type_hint(value, tp)}")
    else:  # a field type this loader does not know: say so rather than accept anything
        out.add(where, f"cannot check values of type {tp!r}; the loader needs support for it")
    return _BAD


def _fits(value: Any, tp: Any) -> bool:
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    if tp is dict:
        return isinstance(value, dict)
    return False


def _type_hint(value: Any, tp: Any) -> str:
    """A fix for the common slips: quoted numbers and booleans, 3.0 for an integer."""
    if isinstance(value, str) and tp in (int, float):
        try:
            number = tp(value.strip())
        except ValueError:
            return ""
        return f"; write {number} without quotes"
    if isinstance(value, str) and tp is bool and value.strip().lower() in ("true", "false"):
        return f"; write {value.strip().lower()} without quotes"
    if isinstance(value, float) and tp is int and value.is_integer():
        return f"; write {int(value)}"
    return ""


def _array(value: Any, tp: Any, elem: Any, where: str, out: Problems) -> Any:
    if not isinstance(value, list):
        hint = ""
        if is_table(elem) and isinstance(value, dict):
            hint = f"; write [[{_INDEX.sub('', where)}]] for each entry"
        out.add(where, f"expected {type_name(tp)}, got {show(value)}{hint}")
        return _BAD
    items = [_convert(v, elem, f"{where}[{i}]", out) for i, v in enumerate(value)]
    if any(item is _BAD for item in items):
        out.distrust(where)  # indices no longer line up with the file: rules skip this array
        return tuple(item for item in items if item is not _BAD)
    return tuple(items)
