"""The line of a key path in a scenario file, for problem lines (``x.toml: line 7: ...``).

``tomllib`` keeps no positions, so the line is found in the text: the section a key path
starts in (the lines before the first table header, a ``[table]``, or the n-th
``[[array-of-tables]]``), the ``key =`` line inside it, and for an index into an inline array
of tables (``workload.requests[2]``) the line where that element's ``{`` opens. It covers the
shapes scenario files use (SCENARIOS.md); where a path cannot be placed (a key written as a
dotted key at the top, a value split over lines in an unusual way) it answers None and the
problem line simply has no line number.
"""

from __future__ import annotations

import re

_PART = re.compile(r"([A-Za-z0-9_-]+)((?:\[\d+\])*)")
_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")


class KeyLocator:
    """Answers :meth:`line` for key paths of one file's text."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        # (line index, table name, array index or None) of every table header, in order
        self.headers: list[tuple[int, str, int | None]] = []
        counts: dict[str, int] = {}
        for index, line in enumerate(self.lines):
            m = _HEADER.match(line)
            if m is None:
                continue
            name = m.group(2)
            if m.group(1) == "[[":
                self.headers.append((index, name, counts.get(name, 0)))
                counts[name] = counts.get(name, 0) + 1
            else:
                self.headers.append((index, name, None))

    def line(self, key_path: str) -> int | None:
        """The 1-based line of ``key_path`` (``protocol.war_barrier``, ``mutation[1].remove[0]``,
        ``workload.requests[2].prompt_len``), or None when it cannot be placed."""
        parts = [(m.group(1), [int(i) for i in re.findall(r"\d+", m.group(2))])
                 for m in _PART.finditer(key_path)]
        if not parts:
            return None
        head, head_index = parts[0]
        section = self._section(head, head_index[0] if head_index else None)
        if section is not None and len(parts) == 1:
            return section[0] + 1  # the table's own header
        if section is None:  # a top-level key
            first = self.headers[0][0] if self.headers else len(self.lines)
            return self._key_line(range(0, first), head, head_index)
        start, end = section
        key, indices = parts[1]
        found = self._key_line(range(start + 1, end), key, indices)
        return found if found is not None else start + 1

    def _section(self, name: str, index: int | None) -> tuple[int, int] | None:
        for n, (line, table, array_index) in enumerate(self.headers):
            if table == name and (array_index == index or (index is None and array_index is None)):
                end = self.headers[n + 1][0] if n + 1 < len(self.headers) else len(self.lines)
                return line, end
        return None

    def _key_line(self, span: range, key: str, indices: list[int]) -> int | None:
        pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
        for index in span:
            if pattern.match(self.lines[index]):
                stop = self._value_end(index, span.stop)
                braces = sum(self.lines[i].count("{") for i in range(index, stop))
                if indices and braces > indices[0]:
                    return self._nth_brace(index, stop, indices[0]) + 1
                return index + 1
        return None

    def _value_end(self, start: int, stop: int) -> int:
        """One past the last line of the value that starts on line ``start`` (an array may
        run over several lines: it ends where its brackets balance)."""
        depth = 0
        for index in range(start, stop):
            text = self.lines[index].split("=", 1)[1] if index == start else self.lines[index]
            depth += text.count("[") - text.count("]")
            if depth <= 0:
                return index + 1
        return stop

    def _nth_brace(self, start: int, stop: int, nth: int) -> int:
        """The line of the ``nth`` (0-based) ``{`` from line ``start`` on."""
        seen = 0
        for index in range(start, stop):
            opened = self.lines[index].count("{")
            if seen + opened > nth:
                return index
            seen += opened
        return start
