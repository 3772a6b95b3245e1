"""reports/gpu/kernels.md, written by a real GPU run of benchmarks/kernels.py, is consistent.

The report is committed; CI has no GPU, so this test checks on CPU that the file holds what the
benchmark promises: where and when it ran, a row for every variant and batch size, launch
counts that are positive integers, and summary lines that agree with the table.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "reports" / "gpu" / "kernels.md"
COLUMNS = ["variant", "bs", "kernels/call", "device µs", "stream µs", "host µs/call"]


def bench_module():
    """benchmarks/kernels.py, loaded from its path (benchmarks is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "benchmarks/kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def text() -> str:
    return REPORT.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fields(text: str) -> dict[str, str]:
    return dict(re.findall(r"^- ([^:]+): (.+)$", text, flags=re.MULTILINE))


@pytest.fixture(scope="module")
def rows(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == COLUMNS
    assert set(lines[1].replace("|", "")) <= {"-", ":"}
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=True))
            for ln in lines[2:]]  # fmt: skip


def test_report_says_where_when_and_how_it_ran(fields):
    assert fields["device"].startswith("NVIDIA ")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", fields["torch"])
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", fields["triton"])
    when = dt.datetime.strptime(fields["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert when.year >= 2026
    assert "benchmarks/kernels.py" in fields["command"]


def test_table_covers_every_variant_and_batch_size_once(rows):
    bench = bench_module()
    got = sorted((r["variant"], int(r["bs"])) for r in rows)
    want = sorted((v, bs) for v in bench.VARIANTS for bs in bench.BATCH_SIZES)
    assert got == want


def test_launch_counts_are_positive_integers_and_times_positive(rows):
    for r in rows:
        assert re.fullmatch(r"[1-9]\d*", r["kernels/call"]), r
        for col in ("device µs", "stream µs", "host µs/call"):
            assert float(r[col]) > 0, r


def test_summary_lines_agree_with_the_table(fields, rows):
    def counts(variant: str) -> str:
        return "/".join(sorted({r["kernels/call"] for r in rows if r["variant"] == variant},
                               key=int))  # fmt: skip

    fused_line = fields["kernels/call, fused vs unfused gather"]
    assert fused_line == (
        f"{counts('gather-fused')} vs {counts('gather-unfused')} "
        f"(triton: {counts('gather-triton')})"
    )
    assert fields["kernels/call, draft fast vs slow"] == (
        f"{counts('draft-fast')} vs {counts('draft-slow')}"
    )


def test_fused_compile_count_is_recorded(text):
    match = re.search(r"^- fused gather compilations .*: (\d+)$", text, flags=re.MULTILINE)
    assert match and int(match.group(1)) >= 1


def test_gpu_property_tests_ran_and_passed(fields):
    summary = fields["GPU tests"]
    assert re.search(r"\b[1-9]\d* passed\b", summary)
    assert "failed" not in summary and "error" not in summary
