"""Generate the scenario key reference (Markdown) from the dataclasses that validate the keys.

``python -m overlap_harness.scenarios.keyref > docs/scenario-keys.md`` rewrites the page; a test
compares the committed page with :func:`render`, so the page cannot drift from
``model.config``.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

from overlap_harness.model.config import Scenario
from overlap_harness.scenarios.schema import (
    PARTIAL_TABLES,
    RACE_KINDS,
    SYNC_LABELS,
    all_fields,
    choices,
    element_type,
    is_enum,
    is_table,
    type_name,
)

_HEADER = """\
# Scenario file keys

Generated from `model/config.py` by
`python -m overlap_harness.scenarios.keyref > docs/scenario-keys.md`;
do not edit by hand. The loader (`scenarios/loader.py`) validates files against the same
fields: unknown keys, types, choices and ranges are rejected with one line per problem.
Ranges are inclusive. A file without `name` is named after the file.
"""

_RULES = """\
## Cross-field rules

- `spec_v2` with `topk = 1`: `num_draft_tokens` must equal `num_steps + 1` (the fast path).
- `spec_v2` with `topk > 1`: `num_draft_tokens` is at most `1 + topk + (num_steps - 1)*topk^2`.
- `spec_v2` on `platform = "hip"`: no D2H stream, so `seq_lens_d2h` is `schedule_stream` or `none`.
- `delayed_sampling` is the non-spec path; `delayed_stash_after_gather` needs it.
- Request ids are unique and non-empty; a request arrives before `workload.iterations`;
  `chunks <= prompt_len`; `prompt_len + max_new <= protocol.max_context`.
- Events happen before `workload.iterations` and not before their request arrives;
  `idle` events name no request, every other kind names a known request id.
- `check.races` and `mutation.races` entries read `"KIND buffer"`, the buffer one the
  protocol allocates (`scenarios/buffers.py`); `expect = "race_free"` with races listed is a
  contradiction.
- A mutation removes at least one sync or sets at least one key; mutation names are unique
  and not `base`; `mutation.set` overrides obey the protocol rules above.
- Scenario names are unique in a suite.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: Any, tp: Any) -> str:
    if is_table(tp):
        return "(table)"
    if isinstance(value, Enum):
        return f'`"{value.value}"`'
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f"`{json.dumps(value)}`"
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{json.dumps(list(value))}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{json.dumps(value)}`"
    return f"`{value}`"


def _type(cls: type, name: str, tp: Any, where: str) -> str:
    partial = PARTIAL_TABLES.get((cls, name))
    if partial is not None:
        table = next(f.name for f, t in all_fields(Scenario) if t is partial)
        return f"table of [{table}] keys"
    elem = element_type(tp)
    if elem is not None and is_table(elem):
        return f"array of tables, see [[{where}]]"
    if is_table(tp):
        return f"table, see [{where}]"
    return type_name(tp, article=False)


def _allowed(f: Any, tp: Any) -> str:
    if is_enum(tp):
        return choices(tp)
    if "range" in f.metadata:
        lo, hi = f.metadata["range"]
        return f"{lo}..{hi}"
    return ""


def _section(cls: type, prefix: str, title: str, lines: list[str],
             nested: list[tuple[type, str, str]]) -> None:
    lines += ["", f"## {title}", "", (cls.__doc__ or "").strip(), "",
              "| key | type | default | choices / range | description |",
              "| --- | --- | --- | --- | --- |"]
    for f, tp in all_fields(cls):
        where = f"{prefix}.{f.name}" if prefix else f.name
        default = f.default_factory() if callable(f.default_factory) else f.default
        help_text = f.metadata.get("help", "")
        if f.metadata.get("internal"):
            help_text += " (not a file key)"
        row = [f"`{f.name}`", _type(cls, f.name, tp, where), _default(default, tp),
               _allowed(f, tp), help_text]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        elem = element_type(tp)
        if is_table(tp):
            nested.append((tp, where, f"[{where}]"))
        elif elem is not None and is_table(elem):
            nested.append((elem, where, f"[[{where}]]"))


def render() -> str:
    """The whole key reference page, generated from ``model.config``'s dataclasses."""
    lines = [_HEADER.rstrip("\n")]
    queue: list[tuple[type, str, str]] = []
    _section(Scenario, "", "Top level", lines, queue)
    while queue:
        cls, prefix, title = queue.pop(0)
        _section(cls, prefix, title, lines, queue)
    lines += ["", "## Sync labels (`mutation.remove`)", ""]
    lines += [f"- `{label}`" for label in SYNC_LABELS]
    lines += ["", "## Race kinds (`check.races`, `mutation.races`)", ""]
    lines += [f"- `{kind}`" for kind in RACE_KINDS]
    lines += ["", _RULES.rstrip("\n")]
    return "\n".join(lines) + "\n"


def main() -> None:
    """Write the reference page to stdout."""
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
