"""The committed GPU report of SGLang's kernels against the project's is consistent (issue 16.5).

tools/sglang_kernels_report.py writes reports/gpu/<date>-<device>-sglang-kernels.json and .md on
a GPU; CI has none, so this test reads the newest committed pair and checks that it says where
and with what it ran, that its totals are the sums of its rows, that every test of
tests/gpu/test_sglang_kernels_gpu.py has a row with as many cases as its hypothesis settings
ask, and that the stated verdict follows from the rows.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted((ROOT / "reports" / "gpu").glob("*-sglang-kernels.json"))
GPU_TESTS = ROOT / "tests" / "gpu" / "test_sglang_kernels_gpu.py"

pytestmark = pytest.mark.skipif(not REPORTS, reason="no SGLang kernel report committed yet")


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads(REPORTS[-1].read_text(encoding="utf-8"))


def settings_examples() -> dict[str, int]:
    """test function name -> max_examples of the settings object decorating it (read from the
    test file's source, so the expectation is the test file's, not the report's)."""
    tree = ast.parse(GPU_TESTS.read_text(encoding="utf-8"))
    settings = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for keyword in node.value.keywords:
                if keyword.arg == "max_examples":
                    settings[node.targets[0].id] = ast.literal_eval(keyword.value)
    examples = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            names = [d.id for d in node.decorator_list if isinstance(d, ast.Name)]
            examples[node.name] = next((settings[n] for n in names if n in settings), 1)
    return examples


def test_report_names_the_machine_and_versions(report):
    assert report["device"] and report["torch"] and report["cuda"] and report["triton"]
    assert report["sglang"] == "0.5.23"
    assert report["triton_interpret"] == "", "SGLang's kernels must run compiled on the GPU"
    assert re.match(r"\d{4}-\d\d-\d\dT", report["date"])
    assert "sglang_kernels_report.py" in report["command"]


def test_totals_are_the_sums_of_the_rows(report):
    rows = report["tests"]
    assert report["total_cases"] == sum(r["cases"] for r in rows)
    assert report["total_mismatches"] == sum(r["mismatches"] for r in rows)
    assert report["tests_passed"] == sum(r["outcome"] == "passed" for r in rows)


def test_every_gpu_test_has_a_row_with_all_its_cases(report):
    by_function: dict[str, list[dict]] = {}
    for row in report["tests"]:
        by_function.setdefault(row["test"].split("[")[0], []).append(row)
    for function, examples in settings_examples().items():
        assert function in by_function, f"{function} has no row"
        for row in by_function[function]:
            assert row["cases"] >= examples, (function, row["cases"], examples)


def test_verdict_follows_from_the_rows(report):
    all_equal = (report["pytest_exit"] == 0 and report["total_mismatches"] == 0
                 and report["tests_passed"] == len(report["tests"]))
    assert report["verdict"] == ("equal on every case" if all_equal else "NOT equal")
    page = REPORTS[-1].with_suffix(".md").read_text(encoding="utf-8")
    assert f"verdict: **{report['verdict']}**: {report['total_cases']} cases compared, " \
           f"{report['total_mismatches']} mismatches" in page
    for row in report["tests"]:
        assert f"| {row['test']} | {row['outcome']} | {row['cases']} | {row['mismatches']} |" \
            in page
