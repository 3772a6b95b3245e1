"""File names made from names the user chose (scenario names, run ids, script names).

A name becomes a report's file name (``plots/<run id>.png``, ``scenarios/<run id>.json``), so
it is made safe here: characters other than letters, digits and ``_ . -`` become ``_``, and a
name longer than :data:`MAX_STEM` is cut, with a short digest of the whole name appended, so
two long names that share their first characters still get two files. File systems allow
255 bytes per name; the stem leaves room for any suffix the reports add (``.json.gz``).
"""

from __future__ import annotations

import hashlib
import re

MAX_STEM = 120
"""The longest stem :func:`safe_name` returns, in characters (ASCII: bytes too)."""
_DIGEST_CHARS = 10
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(name: str) -> str:
    """A file-system-safe stem for ``name``, at most :data:`MAX_STEM` characters.

    Short names keep their look (``scenario/mutation-hash`` gives ``scenario_mutation-hash``);
    a longer one is its first characters, ``-`` and a digest of the whole name."""
    stem = _UNSAFE.sub("_", name)
    if stem in ("", ".", ".."):
        stem = stem.replace(".", "_") or "_"
    if len(stem) <= MAX_STEM:
        return stem
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass"),
                          usedforsecurity=False).hexdigest()[:_DIGEST_CHARS]
    return f"{stem[:MAX_STEM - _DIGEST_CHARS - 1]}-{digest}"
