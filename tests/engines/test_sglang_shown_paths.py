"""``overlap-harness sglang`` names files the same on every machine: SGLang's files from the
tree's root (``sglang/srt/managers/scheduler.py:4672``), the harness's from its checkout
(``overlap_harness/engines/sglang/stand_ins/...``), in its text, its JSON, the loop report
(JSON and Markdown), ``--out``'s table (JSON and Markdown) and the SARIF and Perfetto files
``--out`` writes per variant (the SARIF's ``%SRCROOT%`` is the tree's root). The tree itself
is named where it is (``source``, the first line): that is where the run read it from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.engines.sglang_trees import ROOT, installed_sglang, run_sglang

#: intact races (28, on both sides SGLang's lines), a few sites reached: a cheap variant that
#: still writes race sides and site rows
VARIANT = "dspark_no_host_lengths"


@pytest.mark.engine_run
def test_no_output_names_an_engine_or_harness_file_absolutely(tmp_path: Path) -> None:
    tree_root = installed_sglang().parent
    status, output, document = run_sglang(
        "--variant", VARIANT, "--necessity", "-j", "1", "--loop-report",
        str(tmp_path / "loop"), "--out", str(tmp_path / "out"),
        json_path=tmp_path / "table.json")
    assert status == 1, output  # the variant's own races (SGLang as released)
    sides = [side for r in document["races"] for side in (r["first"], r["second"])]
    assert sides and all(s["file"].startswith("sglang" + os.sep) for s in sides), sides
    rows = document["necessity"]
    assert rows and all(r["site"].startswith("sglang" + os.sep) for r in rows)
    variant = tmp_path / "out" / VARIANT
    written = [tmp_path / "table.json", *sorted((tmp_path / "loop").iterdir()),
               tmp_path / "out" / "sglang-loop.json", tmp_path / "out" / "sglang-loop.md",
               variant / "results.sarif", variant / "trace.json"]
    texts = {"output": output} | {str(p.relative_to(tmp_path)): p.read_text() for p in written}
    absolute = (f"{tree_root}{os.sep}sglang{os.sep}", f"{ROOT}{os.sep}overlap_harness{os.sep}")
    for name, text in texts.items():
        for prefix in absolute:
            assert prefix not in text, (name, prefix,
                                        text[max(0, text.find(prefix) - 200):][:400])
    assert len(texts) == 8
    sarif = json.loads(texts[str(variant.relative_to(tmp_path) / "results.sarif")])
    uris = {(location["physicalLocation"]["artifactLocation"]["uri"],
             location["physicalLocation"]["artifactLocation"]["uriBaseId"])
            for result in sarif["runs"][0]["results"] for location in result["locations"]}
    assert uris and all(uri.startswith("sglang/") and base == "%SRCROOT%"
                        for uri, base in uris), uris
