"""The one rule for what a command writes: its output paths are prepared before any work.

Every command that writes files calls :func:`prepare_outputs` first, before it loads,
simulates, measures or imports anything heavy, with each output named by the option that
gave it::

    from overlap_harness.output_paths import prepare_outputs

    prepare_outputs(files={"--json": args.json}, folders={"--out": args.out})

A folder is made (with its parents) and a probe file is created and removed in it, so a
folder the command could not write is found now, not after the run. A file's parent folder is
prepared the same way (under the option's name plus ``folder``); the file must not be a
folder, and one that exists must open for appending. A path component longer than the file
system allows is refused before anything is made. ``None`` and ``"-"`` (stdout) are skipped.

Any problem raises :class:`OutputPathError` with one line, ``--out PATH: reason``; the
command line (``overlap_harness.cli.main``, which runs every subcommand's handler) prints it
as ``overlap-harness: ...`` and exits 2 (no traceback). A folder on a file system without
storage (/proc, /sys) is named as such. Folders made before a later problem stay made: an
empty folder is harmless, and the next run uses it.

A new command registers its handler in ``overlap_harness.cli.SUBCOMMANDS`` and calls
:func:`prepare_outputs` as its first step; tests/cli/test_output_paths.py finds every FILE or
DIR option (and every ``--*out``) of every command and fails until the option has its case
there, which runs it with each kind of bad path.

Names that become file names (run ids, scenario names) go through :func:`safe_name`, which
bounds their length and keeps only safe characters.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from overlap_harness.model.errors import HarnessError
from overlap_harness.reports.file_names import MAX_STEM, safe_name

__all__ = ["MAX_STEM", "OutputPathError", "prepare_outputs", "safe_name"]

PathArg = str | os.PathLike[str] | None
_SHOWN_AT_MOST = 120  # characters of a path a message shows: a long path stays readable
_DEFAULT_NAME_MAX = 255
_DEFAULT_PATH_MAX = 4096
_PROBE_PREFIX = ".overlap-harness-probe-"


class OutputPathError(HarnessError):
    """An output file or folder a command cannot write; the message is one line."""


def prepare_outputs(files: Mapping[str, PathArg] | None = None,
                    folders: Mapping[str, PathArg] | None = None) -> None:
    """Prepare every output of a command before it does any work (see the module docstring).

    ``files`` and ``folders`` map the option that named each output (``"--json"``) to its
    path; ``None`` and ``"-"`` are skipped. Folders are checked first, then files, each in
    the order given.

    Raises:
        OutputPathError: the first output that cannot be written, as one line.
    """
    for flag, path in (folders or {}).items():
        if path is not None and str(path) != "-":
            _prepare_folder(Path(path), flag)
    for flag, path in (files or {}).items():
        if path is not None and str(path) != "-":
            _prepare_file(Path(path), flag)


def _shown(path: Path | str) -> str:
    """``path`` as a message shows it: whole, or its two ends around ``...`` when long."""
    text = str(path)
    if len(text) <= _SHOWN_AT_MOST:
        return text
    half = _SHOWN_AT_MOST // 2 - 2
    return f"{text[:half]}...{text[-half:]} ({len(text)} characters)"


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (``.`` for a relative path)."""
    existing = path
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    return existing


def _limit(folder: Path, name: str, default: int) -> int:
    """``os.pathconf`` of ``folder`` (``PC_NAME_MAX`` / ``PC_PATH_MAX``), or ``default``."""
    try:
        return int(os.pathconf(folder if folder.is_dir() else folder.parent, name))
    except (OSError, ValueError):
        return default


def _check_length(path: Path, flag: str) -> None:
    """Refuse a path, or one of its names, longer than the file system takes."""
    existing = _nearest_existing(path)
    name_max = _limit(existing, "PC_NAME_MAX", _DEFAULT_NAME_MAX)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise OutputPathError(
                f"{flag} {_shown(path)}: the name {_shown(part[:40])}... is {size} bytes "
                f"long; the file system allows at most {name_max}: choose a shorter name")
    path_max = _limit(existing, "PC_PATH_MAX", _DEFAULT_PATH_MAX)
    size = len(os.fsencode(str(path)))
    if size >= path_max:
        raise OutputPathError(f"{flag} {_shown(path)}: the path is {size} bytes long; the file "
                              f"system allows fewer than {path_max}: choose a shorter path")


def _failed(folder: Path, flag: str, what: str, exc: OSError) -> OutputPathError:
    """The error for a folder that could not be made or written: ``what`` and the system's
    reason, or, when the folder lies on a file system with no storage (it reports no
    blocks, as /proc and /sys do), that. Only a failed write is ever refused, so an unusual
    file system that does take files is never turned away by this guess."""
    existing = _nearest_existing(folder)
    try:
        virtual = os.statvfs(existing).f_blocks == 0
    except OSError:
        virtual = False
    if virtual:
        return OutputPathError(f"{flag} {_shown(folder)}: {_shown(existing)} is on a virtual "
                               "file system, not storage: give a folder on a disk")
    return OutputPathError(f"{flag} {_shown(folder)}: {what}: {_reason(exc)}")


def _reason(exc: OSError) -> str:
    """An OSError as the end of a message line."""
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system: choose a shorter name"
    return exc.strerror or str(exc)


def _prepare_folder(folder: Path, flag: str) -> None:
    """Make ``folder`` (and its parents) and prove it writable with a probe file."""
    _check_length(folder, flag)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"{flag} {_shown(folder)}: is a file, not a folder")
    existing = _nearest_existing(folder)
    if existing != folder and not existing.is_dir():
        raise OutputPathError(f"{flag} {_shown(folder)}: {_shown(existing)} is not a folder, "
                              f"so {_shown(folder)} cannot be made")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _failed(folder, flag, "cannot make the folder", exc) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {_shown(folder)}: is not writable")
    try:  # os.access says yes to root everywhere: only a write proves it
        handle, probe = tempfile.mkstemp(prefix=_PROBE_PREFIX, dir=folder)
    except OSError as exc:
        raise _failed(folder, flag, "is not writable", exc) from None
    os.close(handle)
    os.unlink(probe)


def _prepare_file(file: Path, flag: str) -> None:
    """Prepare the parent folder of ``file``; refuse a folder, or a file not writable."""
    _check_length(file, flag)
    if file.is_dir():
        raise OutputPathError(f"{flag} {_shown(file)}: is a folder; give a file name")
    _prepare_folder(file.parent, f"{flag} folder")
    if file.exists():
        try:
            with open(file, "a"):  # appends nothing: the content stays as it is
                pass
        except OSError as exc:
            raise OutputPathError(f"{flag} {_shown(file)}: is not writable: "
                                  f"{_reason(exc)}") from None
