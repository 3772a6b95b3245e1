"""The recorder on the corpus (tests/recorder_corpus/), in CPU mode: the verdicts are the
recorder's, the expectations the manifest's (corpus.toml, from STREAM-SEMANTICS.md).

Every racy twin must report at least each predicted race (kind, tensor, both access sites on
the marked lines of the program's own file, the element range where given); every fixed twin
must report none. Each program must also run to its end under the recorder and print the
value its author meant: CPU mode computes values in issue order, the serial oracle, which is
the order every corpus program means. Most programs run in-process under ``recorder.watch``
(one torch import for all); two pairs also go through the command line,
``overlap-harness check --cpu --json`` (its ``main``, in-process), for its exit status and JSON.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from overlap_harness import cli
from tests.recorder_corpus.manifest import (
    CORPUS_DIR,
    ManifestError,
    Pair,
    corpus_programs,
    load_manifest,
)
from tests.recorder_corpus.runner import parse_result
from tests.recorder_corpus.verdicts import from_json, unmatched, watch_program

ROOT = Path(__file__).resolve().parent.parent.parent
PAIRS = load_manifest()
CLI_PAIRS = ("reuse_no_record_stream", "index_rows")
# The programs (and their helper) are user code: the standard library, torch and the helper.
ALLOWED_IMPORTS = set(sys.stdlib_module_names) | {"torch", "corpus_helper"}
USER_CODE = sorted([*CORPUS_DIR.glob("*_racy.py"), *CORPUS_DIR.glob("*_fixed.py"),
                    CORPUS_DIR / "corpus_helper.py"])

needs_recorder = pytest.mark.skipif(
    importlib.util.find_spec("recorder") is None,
    reason="the recorder package (issue 15) is not in this tree yet")


def _program_id(case: tuple[Pair, bool]) -> str:
    pair, racy = case
    return f"{pair.name}_{'racy' if racy else 'fixed'}"


def test_the_manifest_names_every_program_of_the_folder() -> None:
    on_disk = {p.name for p in CORPUS_DIR.glob("*_racy.py")} | {
        p.name for p in CORPUS_DIR.glob("*_fixed.py")}
    named = {pair.racy_path.name for pair in PAIRS} | {pair.fixed_path.name for pair in PAIRS}
    assert on_disk == named
    assert len(PAIRS) >= 19


@pytest.mark.parametrize("program", USER_CODE, ids=lambda p: p.name)
def test_programs_import_nothing_of_the_harness(program: Path) -> None:
    tree = ast.parse(program.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= ALLOWED_IMPORTS, program.name


def test_a_bad_manifest_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "corpus.toml"
    bad.write_text(
        '[[pair]]\nname = "h2d_side_stream"\ncolour = "red"\n'
        '[[pair.race]]\nkind = "RAWR"\ntensor = "staged"\nsites = ["h2d", "consume"]\n'
        '[[pair.race]]\nkind = "RAW"\ntensor = "staged"\nsites = ["h2d", "nowhere"]\n'
        '[[pair]]\nname = "no_such_program"\n', encoding="utf-8")
    with pytest.raises(ManifestError) as caught:
        load_manifest(bad)
    where = "corpus.toml: pair[0] (h2d_side_stream)"
    missing = "corpus.toml: pair[1] (no_such_program)"
    assert str(caught.value).splitlines() == [
        f"{where}.colour: unknown key (expected one of ['covers', 'gpu_pending', 'name', 'race'])",
        f"{where}.race[0].kind: expected one of RAW|WAR|WAW|host-D2H|reuse, got 'RAWR'",
        f"{where}: h2d_side_stream_racy.py has no `# corpus-site: nowhere` marker",
        f"{missing}.race: a racy twin must predict at least one race",
        f"{missing}: program no_such_program_racy.py is missing from {CORPUS_DIR}",
        f"{missing}: program no_such_program_fixed.py is missing from {CORPUS_DIR}",
    ]


def test_a_result_line_is_read_back() -> None:
    output = 'noise\nCORPUS_RESULT {"program": "p", "value": [1], "expected": [2], "ok": false}\n'
    assert parse_result(output) == {"program": "p", "value": [1], "expected": [2], "ok": False}
    assert parse_result("no result here\n") is None


@needs_recorder
@pytest.mark.parametrize("case", corpus_programs(PAIRS), ids=_program_id)
def test_recorder_cpu_verdict_meets_the_manifest(case: tuple[Pair, bool]) -> None:
    pair, racy = case
    program = pair.racy_path if racy else pair.fixed_path
    run, races = watch_program(program, "cpu")
    assert run.completed, f"{program.name} did not complete: {run.error_type}: {run.error}"
    assert run.value == run.expected, f"{program.name}: CPU mode is not the serial oracle"
    if racy:
        assert unmatched(pair.races, races, program) == []
    else:
        assert [(r.kind, r.tensor, r.key()) for r in races] == []


@needs_recorder
@pytest.mark.parametrize("name", CLI_PAIRS)
def test_check_command_on_a_pair(name: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # In-process: the command's own code path without a second torch start-up (~10 s here).
    monkeypatch.chdir(ROOT)
    pair = next(p for p in PAIRS if p.name == name)
    for program, status in ((pair.racy_path, 1), (pair.fixed_path, 0)):
        out = tmp_path / f"{program.stem}.json"
        code = cli.main(["check", "--cpu", "--json", str(out), str(program)])
        printed = capsys.readouterr()
        assert code == status, printed.out + printed.err
        assert "CORPUS_RESULT" in printed.out  # the script's own output passes through
        report = json.loads(out.read_text(encoding="utf-8"))
        races = [from_json(r) for r in report["races"]]
        if status:
            assert unmatched(pair.races, races, program) == []
        else:
            assert races == []
