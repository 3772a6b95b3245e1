"""Write the default scenario suite (scenarios/*.toml) from the table below.

The TOML files are the artifact users read and edit; this script only saves typing and keeps
the workloads identical across files. Re-run after editing: python tools/gen_suite.py
Nothing here states a verdict the detector did not compute: ``expect`` and ``races`` are the
expectations a run is checked against.
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "scenarios"

W = {
    "steady": ('iterations = 6\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
               '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n]\n'),
    "recycle": ('iterations = 8\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 2 },\n'
                '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n'
                '  { id = "C", arrive = 3, prompt_len = 5, max_new = 40 },\n]\n'),
    "evict": ('iterations = 7\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
              '  { id = "B", arrive = 0, prompt_len = 10, max_new = 40 },\n]\n'
              'events = [{ at = 4, kind = "evict_swa", id = "A" }]\n'),
    "mixed": ('iterations = 12\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 30 },\n'
              '  { id = "B", arrive = 0, prompt_len = 6, max_new = 5 },\n'
              '  { id = "C", arrive = 2, prompt_len = 20, max_new = 6, chunks = 3 },\n'
              '  { id = "D", arrive = 5, prompt_len = 4, max_new = 30 },\n]\n'
              'events = [{ at = 4, kind = "retract", id = "A" }, { at = 8, kind = "idle" }]\n'),
    "chunked": ('iterations = 9\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 6, max_new = 12 },\n'
                '  { id = "B", arrive = 0, prompt_len = 6, max_new = 12 },\n'
                '  { id = "C", arrive = 2, prompt_len = 20, max_new = 4, chunks = 3 },\n]\n'),
    "idle": ('iterations = 8\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
             '  { id = "B", arrive = 1, prompt_len = 6, max_new = 40 },\n]\n'
             'events = [{ at = 3, kind = "idle" }, { at = 4, kind = "idle" }, { at = 6, kind = "idle" }]\n'),
    "bootstrap": ('iterations = 2\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 8, max_new = 10 },\n]\n'),
    "long": ('iterations = 16\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 14 },\n'
             '  { id = "B", arrive = 0, prompt_len = 6, max_new = 60 },\n'
             '  { id = "C", arrive = 2, prompt_len = 12, max_new = 8 },\n'
             '  { id = "D", arrive = 4, prompt_len = 7, max_new = 60 },\n'
             '  { id = "E", arrive = 9, prompt_len = 9, max_new = 60 },\n]\n'),
    "mixed_chunk": ('iterations = 7\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
                    '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n'
                    '  { id = "X", arrive = 3, prompt_len = 5, max_new = 40 },\n'
                    '  { id = "C", arrive = 4, prompt_len = 5, max_new = 40 },\n'
                    '  { id = "D", arrive = 4, prompt_len = 7, max_new = 40 },\n]\n'
                    'events = [{ at = 3, kind = "mixed_chunk", id = "X" }]\n'),
    "double_stash": ('iterations = 7\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
                     '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n]\n'
                     'events = [{ at = 3, kind = "double_stash", id = "A" }]\n'),
    "skip_seed": ('iterations = 7\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
                  '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n]\n'
                  'events = [{ at = 0, kind = "skip_seed", id = "B" }]\n'),
    "merge_skip_publish": ('iterations = 6\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
                           '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n'
                           '  { id = "C", arrive = 3, prompt_len = 5, max_new = 40 },\n'
                           '  { id = "D", arrive = 3, prompt_len = 7, max_new = 40 },\n]\n'
                           'events = [{ at = 3, kind = "skip_publish", id = "C" }]\n'),
    "finish_late": ('iterations = 7\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n'
                    '  { id = "B", arrive = 0, prompt_len = 6, max_new = 40 },\n'
                    '  { id = "C", arrive = 4, prompt_len = 5, max_new = 40 },\n]\n'
                    'events = [{ at = 3, kind = "finish_late", id = "A" }]\n'),
    "solo": ('iterations = 6\nrequests = [\n  { id = "A", arrive = 0, prompt_len = 10, max_new = 40 },\n]\n'),
}


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    return str(v)


def scenario(name: str, desc: str, protocol: dict, workload: str, expect: str = "race_free",
             races: list[str] | None = None, mutations: list[dict] | None = None,
             timing: dict | None = None, check: dict | None = None) -> str:
    lines = [f'name = "{name}"', f"description = {toml_value(desc)}", "", "[protocol]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in protocol.items()]
    lines += ["", "[workload]", W[workload].rstrip()]
    if timing:
        lines += ["", "[timing]"] + [f"{k} = {toml_value(v)}" for k, v in timing.items()]
    lines += ["", "[check]", f'expect = "{expect}"']
    if races:
        lines.append(f"races = {toml_value(races)}")
    for k, v in (check or {}).items():
        lines.append(f"{k} = {toml_value(v)}")
    for m in mutations or []:
        lines += ["", "[[mutation]]"]
        for k in ("name", "remove", "set", "expect", "races"):
            if k in m:
                lines.append(f"{k} = {toml_value(m[k])}")
    return "\n".join(lines) + "\n"


def main() -> None:
    from suite_table import SUITE

    OUT.mkdir(exist_ok=True)
    for old in OUT.rglob("*.toml"):
        old.unlink()
    for folder, name, kwargs in SUITE:
        d = OUT / folder
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.toml").write_text(scenario(name, **kwargs))
    print(f"wrote {len(SUITE)} scenarios under {OUT}")


if __name__ == "__main__":
    main()
