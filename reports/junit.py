"""JUnit XML: one test case per scenario and mutation; the failure text is the race report.

Every ``testcase`` and the ``testsuite`` carry ``time=`` (seconds, the run and its oracle;
CI dashboards sort and chart by it) from :attr:`CaseResult.wall_s`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from overlap_harness.model.results import CaseResult


def failure_text(r: CaseResult) -> str:
    """Why a case failed: the verdict against the expectation, then every race report."""
    lines = [f"expected {r.expect}, detector computed {r.verdict}"]
    if r.error:
        lines.append(f"error: {r.error}")
    if r.missing:
        lines.append("expected races not found: " + ", ".join(r.missing))
    lines += [race.describe() for race in r.races]
    lines += [f"debug check: {f}" for f in r.faults]
    lines += [f"value diff: {d}" for d in r.value_diffs[:10]]
    return "\n".join(lines)


def to_junit(results: Sequence[CaseResult], suite: str = "overlap-harness") -> str:
    """The JUnit XML document for ``results``."""
    fails = sum(1 for r in results if not r.ok and r.error is None)
    errors = sum(1 for r in results if r.error is not None)
    root = ET.Element("testsuites")
    total = sum(r.wall_s for r in results)
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)),
                       failures=str(fails), errors=str(errors), time=f"{total:.3f}")
    for r in results:
        tc = ET.SubElement(ts, "testcase", classname=r.scenario, name=r.mutation or "base",
                           file=r.path, time=f"{r.wall_s:.3f}")
        if r.error is not None:
            ET.SubElement(tc, "error", message=r.error).text = failure_text(r)
        elif not r.ok:
            msg = f"expected {r.expect}, got {r.verdict}"
            ET.SubElement(tc, "failure", message=msg).text = failure_text(r)
        elif r.races:
            ET.SubElement(tc, "system-out").text = "\n".join(x.describe() for x in r.races)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(results: Sequence[CaseResult], path: str | Path) -> None:
    """Write :func:`to_junit` to ``path``."""
    Path(path).write_text(to_junit(results))
