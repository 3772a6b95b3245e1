"""``overlap-harness check``'s report for a person: golden text for races named after the
program's variables (tuple targets too), element ranges, host-memory races by direction,
portability notes for pageable copies; the JSON form (ranges, counts, directions, notes,
read back by the corpus's ``from_json``); ``--json -`` keeping stdout for the document.
Every racy program has its fixed twin."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from overlap_harness.cli import main
from tests.recorder_corpus.verdicts import from_json

NAMES = textwrap.dedent("""\
    import sys
    import torch

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    table = torch.zeros(4, 4, device="cuda")
    values, order = torch.arange(8.0, device="cuda").sort(descending=True)
    for stream in (s1, s2):
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s1):
        table[::2].fill_(1)
    with torch.cuda.stream(s2):
        order.add_(1)
    if "--fixed" in sys.argv:
        torch.cuda.current_stream().wait_stream(s1)
        torch.cuda.current_stream().wait_stream(s2)
    print(table.sum().item(), order.sum().item(), values.sum().item())
    """)

HOST = textwrap.dedent("""\
    import sys
    import torch

    copier = torch.cuda.Stream()
    device_out = torch.arange(4.0, device="cuda")
    staging = torch.zeros(4).pin_memory()
    host_out = torch.empty(4).pin_memory()
    done = torch.cuda.Event()
    copier.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copier):
        host_out.copy_(device_out, non_blocking=True)
        device_out.copy_(staging, non_blocking=True)
        done.record()
    if "--fixed" in sys.argv:
        done.synchronize()
    print(host_out.tolist())
    staging.fill_(5)
    """)

PAGEABLE = textwrap.dedent("""\
    import sys
    import torch

    copier = torch.cuda.Stream()
    device_out = torch.arange(4.0, device="cuda")
    if "--pinned" in sys.argv:
        host_out = torch.empty(4, pin_memory=True)
    else:
        host_out = torch.empty(4)
    copier.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copier):
        host_out.copy_(device_out, non_blocking=True)
        for _ in range(2):
            device_out.copy_(torch.ones(4), non_blocking=True)
    print(host_out.tolist())
    """)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The programs' folder, the working directory (sites print relative to it)."""
    for name, text in (("names.py", NAMES), ("host.py", HOST), ("pageable.py", PAGEABLE)):
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, list[str]]:
    """Exit status and stdout lines of ``check --cpu ARGV``, the op count of the summary
    line as ``N`` (how many ops a program records is not the report's business)."""
    status = main(["check", "--cpu", *argv])
    return status, [OPS.sub("N ops recorded", line)
                    for line in capsys.readouterr().out.splitlines()]


OPS = re.compile(r"\d+ ops recorded")


def test_races_are_named_after_the_programs_variables(folder, capsys) -> None:
    status, lines = check(capsys, "names.py")
    assert status == 1
    assert lines[1:] == [
        "RAW race on table (allocated at names.py:5), elements 0-3, 8-11 (8 of 16)",
        "  first:  write by fill_ on stream s1 at names.py:10",
        "  second: read by sum on stream default at names.py:16",
        "RAW race on order (allocated at names.py:6), elements 0-7 (all 8)",
        "  first:  write by add_ on stream s2 at names.py:12",
        "  second: read by sum on stream default at names.py:16",
        "names.py: 2 races (cpu mode, N ops recorded)"]
    status, lines = check(capsys, "names.py", "--fixed")
    assert (status, lines[-1]) == (0, "names.py: 0 races (cpu mode, N ops recorded)")


def test_host_memory_races_say_which_way_the_copy_went(folder, capsys) -> None:
    status, lines = check(capsys, "host.py")
    assert status == 1
    assert lines[1:] == [
        "host-memory (D2H copy vs host read) race on host_out (allocated at host.py:7), "
        "elements 0-3 (all 4)",
        "  first:  write by copy_ on stream copier at host.py:11",
        "  second: read by tolist on the host at host.py:16",
        "host-memory (H2D copy vs host write) race on staging (allocated at host.py:6), "
        "elements 0-3 (all 4)",
        "  first:  read by copy_ on stream copier at host.py:12",
        "  second: write by fill_ on the host at host.py:17",
        "host.py: 2 races (cpu mode, N ops recorded)"]
    status, lines = check(capsys, "host.py", "--fixed")
    assert (status, lines[-1]) == (0, "host.py: 0 races (cpu mode, N ops recorded)")


def test_pageable_copies_are_notes_that_keep_exit_0(folder, capsys) -> None:
    status, lines = check(capsys, "pageable.py")
    assert status == 0
    assert lines[1:] == [
        "note: D2H copy into pageable host memory (host_out) with non_blocking=True on stream "
        "copier at pageable.py:12 is not a race: today's CUDA returns from it only once the "
        "copy has landed, but neither CUDA nor PyTorch promises that (pin host_out for an "
        "asynchronous copy, or drop non_blocking)",
        "note: H2D copy from pageable host memory (a temporary) with non_blocking=True on "
        "stream copier at pageable.py:14 is not a race: today's CUDA returns from it only "
        "once the copy has read its source, but neither CUDA nor PyTorch promises that (pin "
        "the host tensor for an asynchronous copy, or drop non_blocking) (2 times)",
        "pageable.py: 0 races (3 portability notes; cpu mode, N ops recorded)"]
    # the pinned twin: the same read is a race, since the copy may not have landed
    status, lines = check(capsys, "pageable.py", "--pinned")
    assert status == 1
    assert lines[1] == ("host-memory (D2H copy vs host read) race on host_out (allocated at "
                        "pageable.py:7), elements 0-3 (all 4)")


def test_json_has_ranges_counts_directions_and_notes(folder, capsys) -> None:
    assert main(["check", "--cpu", "--json", "out.json", "host.py"]) == 1
    races = json.loads(Path("out.json").read_text())["races"]
    assert [(r["kind"], r["description"], r["direction"], r["elements"], r["element_count"],
             r["count"], r["first"]["iterations"]) for r in races] == [
        ("host-D2H", "D2H copy vs host read", "D2H", [[0, 4]], 4, 1, None),
        ("host-D2H", "H2D copy vs host write", "H2D", [[0, 4]], 4, 1, None)]
    assert from_json(races[0]).elements == (0, 1, 2, 3)  # the corpus reads ranges back
    assert main(["check", "--cpu", "--json", "out.json", "names.py"]) == 1
    table = json.loads(Path("out.json").read_text())["races"][0]
    assert (table["tensor"], table["elements"], table["direction"]) == (
        "table@names.py:5", [[0, 4], [8, 12]], None)
    assert from_json(table).elements == (0, 1, 2, 3, 8, 9, 10, 11)
    assert main(["check", "--cpu", "--json", "out.json", "pageable.py"]) == 0
    document = json.loads(Path("out.json").read_text())
    assert document["races"] == []
    assert [(n["kind"], n["direction"], n["tensor"], n["stream"], n["line"], n["count"])
            for n in document["notes"]] == [
        ("pageable-nonblocking-copy", "D2H", "host_out", "copier", 12, 1),
        ("pageable-nonblocking-copy", "H2D", None, "copier", 14, 2)]


def test_json_dash_prints_the_document_alone_on_stdout(folder, capfd) -> None:
    Path("noisy.py").write_text(NAMES.replace(
        'print(table', 'import os\nos.write(1, b"from C code\\n")\nprint(table'))
    assert main(["check", "--cpu", "--json", "-", "noisy.py"]) == 1
    out, err = capfd.readouterr()
    document = json.loads(out)  # nothing else on stdout
    assert [r["tensor"] for r in document["races"]] == ["table@noisy.py:5", "order@noisy.py:6"]
    assert "from C code" in err and "8.0 36" in err  # the script's own output
    assert "RAW race on table" in err
    assert OPS.sub("N ops recorded", err.splitlines()[-1]) == (
        "noisy.py: 2 races (cpu mode, N ops recorded)")


def test_sarif_has_one_result_per_pair_of_sites_at_the_racing_lines(folder, capsys) -> None:
    Path("loop.py").write_text(textwrap.dedent("""\
        import torch
        side = torch.cuda.Stream()
        data = torch.zeros(8, device="cuda")
        for step in range(3):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                data.add_(1)
            data.sum()
        """))
    status, lines = check(capsys, "--out", "reports", "loop.py")
    assert status == 1 and lines[-1] == (
        "loop.py: 6 races (1 pair of sites; cpu mode, N ops recorded)")
    (result,) = json.loads(Path("reports/results.sarif").read_text())["runs"][0]["results"]
    lines = [result["locations"][0]["physicalLocation"]["region"]["startLine"],
             result["relatedLocations"][0]["physicalLocation"]["region"]["startLine"]]
    assert lines == [8, 7]
    assert result["message"]["text"].splitlines()[0] == (
        "RAW race on data (allocated at loop.py:3), elements 0-7 (all 8), 6 times")


LIKE = textwrap.dedent("""\
    import sys
    import torch

    copier = torch.cuda.Stream()
    device_out = torch.arange(4.0, device="cuda")
    host_out = torch.empty_like(device_out, device="cpu", pin_memory="--pinned" in sys.argv)
    copier.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(copier):
        host_out.copy_(device_out, non_blocking=True)
    print(host_out.is_cuda, host_out.tolist())
    """)


def test_a_host_tensor_made_like_a_device_one_is_host_memory(folder, capsys) -> None:
    """``empty_like(x, device="cpu")`` is pageable host memory (CPU mode took it for device
    memory, and the copy's host read for a stream RAW); pinned, the read races."""
    Path("like.py").write_text(LIKE)
    status, lines = check(capsys, "like.py")
    assert status == 0
    assert lines[0] == "False [0.0, 1.0, 2.0, 3.0]"
    assert lines[1].startswith("note: D2H copy into pageable host memory (host_out) with "
                               "non_blocking=True on stream copier at like.py:9 is not a race")
    status, lines = check(capsys, "like.py", "--pinned")
    assert status == 1
    assert lines[1] == ("host-memory (D2H copy vs host read) race on host_out (allocated at "
                        "like.py:6), elements 0-3 (all 4)")
