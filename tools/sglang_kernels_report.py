"""On a CUDA GPU: SGLang 0.5.23's spec kernels against the project's, as a committed report.

Issue 16 item 5. Runs tests/gpu/test_sglang_kernels_gpu.py (every case of the kernel property
tests, on the GPU, with SGLang's Triton kernels compiled, not interpreted) under pytest and
counts, per test, the cases compared and the mismatches found by wrapping the two comparison
functions of ``overlap_harness.conformance.kernels``. Writes ``<out>/<date>-sglang-kernels.json``
and ``.md``; tests/conformance/test_sglang_kernel_report.py reads the committed copy on the CPU.

    python3 tools/sglang_kernels_report.py --out reports/gpu

Exit status: 0 when every test passed with no mismatch, 1 otherwise, 2 without CUDA or sglang.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overlap_harness.conformance import kernels  # noqa: E402  (after the path is set)
from overlap_harness.conformance.sglang_env import installed_version, unavailable_reason  # noqa: E402

TEST_FILE = "tests/gpu/test_sglang_kernels_gpu.py"
COMPARED = ("gather_mismatches", "chain_mismatches")


class CaseCounter:
    """A pytest plugin: counts the comparisons each test makes and the mismatches they find."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.rows: dict[str, dict] = {}

    def wrap(self) -> None:
        for name in COMPARED:
            real = getattr(kernels, name)

            def counted(*args, _real=real, **kwargs):
                problems = _real(*args, **kwargs)
                row = self.rows[self.current]
                row["cases"] += 1
                row["mismatches"] += len(problems)
                row["examples"].extend(problems[: max(0, 5 - len(row["examples"]))])
                return problems

            setattr(kernels, name, counted)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        self.current = item.name
        self.rows.setdefault(self.current, {"test": self.current, "cases": 0, "mismatches": 0,
                                            "examples": [], "outcome": None})
        yield

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" and self.current in self.rows:
            self.rows[self.current]["outcome"] = report.outcome
        elif report.when == "setup" and report.outcome != "passed":
            name = report.nodeid.split("::")[-1]
            self.rows.setdefault(name, {"test": name, "cases": 0, "mismatches": 0,
                                        "examples": [], "outcome": report.outcome})


def device_facts() -> dict:
    import triton  # deferred: only on the GPU machine

    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__,
            "sglang": installed_version(), "python": platform.python_version(),
            "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
            # SGLang's preallocated chain rows are compared only where base_spec_worker imports
            "chain_rows_compared": kernels.sglang_chain_rows(2, 2, torch.device("cuda"))
            is not None}


def write(out: Path, facts: dict, rows: list[dict], status: int, command: str) -> Path:
    date = dt.datetime.now(dt.UTC)
    total_cases = sum(r["cases"] for r in rows)
    total_mismatches = sum(r["mismatches"] for r in rows)
    passed = sum(r["outcome"] == "passed" for r in rows)
    verdict = ("equal on every case" if status == 0 and total_mismatches == 0
               and passed == len(rows) else "NOT equal")
    data = {**facts, "date": date.isoformat(timespec="seconds"), "command": command,
            "test_file": TEST_FILE, "pytest_exit": status, "tests": rows,
            "total_cases": total_cases, "total_mismatches": total_mismatches,
            "tests_passed": passed, "verdict": verdict}
    stem = out / f"{date:%Y-%m-%d}-sglang-kernels"
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# SGLang 0.5.23's spec kernels against the project's, on the GPU (issue 16 item 5)", "",
        *(f"- {key}: {data[key]}" for key in ("device", "torch", "cuda", "triton", "sglang",
                                               "python", "date")),
        f"- triton_interpret: {facts['triton_interpret'] or 'unset (kernels compiled)'}",
        f"- chain rows compared (SGLang's base_spec_worker imports): "
        f"{facts.get('chain_rows_compared')}",
        f"- command: `{command}`",
        f"- tests: `{TEST_FILE}` (pytest exit {status})",
        f"- verdict: **{verdict}**: {total_cases} cases compared, {total_mismatches} mismatches, "
        f"{passed}/{len(rows)} tests passed", "",
        "| test | outcome | cases | mismatches |", "| --- | --- | --- | --- |",
        *(f"| {r['test']} | {r['outcome']} | {r['cases']} | {r['mismatches']} |" for r in rows),
    ]
    examples = [e for r in rows for e in r["examples"]]
    if examples:
        lines += ["", "First mismatches:", *(f"- {e}" for e in examples)]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu")
    args = parser.parse_args()
    reason = None if torch.cuda.is_available() else "no CUDA device"
    reason = reason or unavailable_reason()
    if reason:
        print(f"sglang_kernels_report: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["OVERLAP_HARNESS_KEEP_PROCESS"] = "1"  # tests/conftest.py: no early exit
    counter = CaseCounter()
    counter.wrap()
    status = int(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", str(ROOT / TEST_FILE)],
                             plugins=[counter]))
    command = "python3 tools/sglang_kernels_report.py --out " + str(args.out)
    stem = write(args.out, device_facts(), list(counter.rows.values()), status, command)
    print(stem.with_suffix(".md").read_text(encoding="utf-8"))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
