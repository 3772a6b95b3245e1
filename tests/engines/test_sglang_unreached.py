"""Why a site is reached by no variant: the reasons read from the source (report/unreached.py), on
synthetic packages (no SGLang needed), and the committed loop report's ``sites`` and
``unreached_sites`` (every unreached site has a reason; recomputed from the installed SGLang
where it is installed)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from overlap_harness.engines.sglang.report import site_configs, unreached

REPORT = Path(__file__).resolve().parents[2] / "reports/conformance/sglang-0.5.23-loop.json"

SOURCE = textwrap.dedent('''
    _is_npu = False
    _is_hip = False

    def npu_only(stream):
        if _is_npu:
            stream.synchronize()

    def hip_else(stream):
        if not _is_hip:
            pass
        else:
            stream.synchronize()

    def early_exit(stream, flag):
        if not (_is_npu and flag):
            return
        stream.synchronize()

    def either(stream):
        if _is_npu or stream is None:
            stream.synchronize()

    def helper(stream):
        stream.synchronize()

    def caller(stream):
        if _is_hip and stream:
            helper(stream)

    def lonely(stream):
        stream.synchronize()

    def documented(stream, on):
        if on:
            stream.synchronize()

    def user(stream):
        either(stream)
        documented(stream, True)
        early_exit(stream, True)
        hip_else(stream)
        npu_only(stream)
''')


@pytest.fixture
def package(tmp_path):
    (tmp_path / "srt").mkdir()
    (tmp_path / "srt" / "mod.py").write_text(SOURCE)
    return tmp_path


def _line(function: str) -> int:
    lines = SOURCE.splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith(f"def {function}("))
    return next(i for i in range(start, len(lines)) if "stream.synchronize()" in lines[i]) + 1


def _reason(package: Path, function: str) -> dict:
    return unreached.reason(package, f"sglang/srt/mod.py:{_line(function)}",
                            "stream.synchronize()")


def test_a_platform_guard_is_found(package):
    assert _reason(package, "npu_only")["category"] == "platform"
    assert "NPU" in _reason(package, "npu_only")["reason"]


def test_an_else_branch_and_an_early_exit_are_guards(package):
    assert _reason(package, "hip_else")["guards"] == ["_is_hip"]
    found = _reason(package, "early_exit")
    assert found["guards"] == ["_is_npu and flag"] and found["category"] == "platform"


def test_a_disjunction_requires_no_platform(package):
    found = _reason(package, "either")
    assert found["category"] == "unknown" and found["reason"] == ""


def test_a_callers_guard_counts_for_a_guard_free_function(package):
    found = _reason(package, "helper")
    assert found["category"] == "platform" and "HIP" in found["reason"]


def test_a_function_nobody_calls_is_unused(package):
    assert _reason(package, "lonely")["category"] == "unused"


def test_a_documented_condition_is_checked_against_the_guards(package, monkeypatch):
    entry = unreached.Condition("mod.py", "documented", "synchronize", "documented", "on",
                                "not_driven", "a test condition")
    monkeypatch.setattr(unreached, "CONDITIONS", (entry,))
    assert _reason(package, "documented")["reason"] == "a test condition"
    stale = unreached.Condition("mod.py", "documented", "synchronize", "documented",
                                "off_switch", "not_driven", "a test condition")
    monkeypatch.setattr(unreached, "CONDITIONS", (stale,))
    found = _reason(package, "documented")
    assert found["category"] == "unknown" and "stale entry" in found["reason"]


@pytest.fixture(scope="module")
def report():
    return json.loads(REPORT.read_text())


def test_the_sites_summary_is_the_rows(report):
    assert report["sites"] == site_configs.per_site(report["rows"])


def test_every_unreached_site_has_a_reason(report):
    never = {s["site"] for s in report["sites"]
             if not (s["necessary_in"] or s["redundant_in"] or s["error_in"])}
    assert {u["site"] for u in report["unreached_sites"]} == never
    for entry in report["unreached_sites"]:
        assert entry["reason"] and entry["category"] != "unknown", entry
        assert entry["category"] in ("platform", "unused", "not_driven", "harness"), entry


def test_at_least_36_of_the_removable_sites_are_reached(report):
    reached = [s for s in report["sites"] if s["necessary_in"] or s["redundant_in"]]
    assert len(reached) >= 36, len(reached)


def test_the_reasons_are_read_again_from_the_installed_sglang(report):
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("sglang is not installed (docs/sglang-loop.md: install)")
    package = Path(spec.submodule_search_locations[0])
    version = importlib.metadata.version("sglang")
    if version != report["sglang_version"]:
        pytest.skip(f"installed sglang {version}, report {report['sglang_version']}")
    codes = {s["site"]: s["code"] for s in report["sites"]}
    for entry in report["unreached_sites"]:
        again = unreached.reason(package, entry["site"], codes[entry["site"]])
        assert again["reason"] == entry["reason"], entry["site"]
